-- Edits: a message keeps its seq and its place; its body is replaced and edited_at says
-- when it last was. NULL: never edited.
ALTER TABLE message ADD COLUMN edited_at TIMESTAMPTZ;
