-- A user's memberships in conversation id order: GET /sync pages through them by id
-- (newest first, from a continuation's id), reading one answer's worth, not all of them.
-- It serves every lookup by user_id alone as well, so the index on user_id goes.
CREATE INDEX conversation_member_user_conversation_idx
    ON conversation_member (user_id, conversation_id);
DROP INDEX conversation_member_user_idx;
