-- Notification levels (issue 29, point 5): per member, what they want to hear about
-- while offline. 'all' (every message), 'mentions' (mentions of them and replies to
-- them), 'none'; muted_until silences everything until then, after which the level
-- applies again. The member row carries them, so the inbox and sync show them and a
-- change reaches the member's other devices in their next sync (changed_xid).
ALTER TABLE conversation_member
    ADD COLUMN notify_level text NOT NULL DEFAULT 'all'
        CONSTRAINT notify_level_known CHECK (notify_level IN ('all', 'mentions', 'none')),
    ADD COLUMN muted_until timestamptz;
