-- A membership version per conversation, carried on every event of the conversation, so
-- fanout can tell that its cached member list missed a change (a membership event lost
-- with the WAL that carried it: a slot dropped, a restore, a failover without failover
-- slots) and load the list from PostgreSQL again (docs/architecture.md, "Fanout").
--
-- `membership_version` goes up by one in each transaction that adds, removes or changes
-- the role of a member of the conversation, however many members it touches:
-- `membership_xid` remembers the transaction that last bumped it. Every outbox row of the
-- conversation is stamped with the version its transaction sees; Debezium's EventRouter
-- puts it on the record as the header `membershipVersion` (decimal text).
--
-- Why this orders: a membership change updates the conversation's row, so it commits
-- before any transaction that sees its version, and chat.events (commit order, one
-- partition per conversation) carries its events before every event stamped with it.
-- An event whose version is newer than fanout's list therefore proves a lost change.

ALTER TABLE conversation
    ADD COLUMN membership_version BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN membership_xid     xid8;

ALTER TABLE outbox ADD COLUMN membership_version BIGINT;

-- Members were added, removed or given another role: one bump per transaction.
CREATE FUNCTION chat_membership_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE conversation c
       SET membership_version = c.membership_version + 1,
           membership_xid = pg_current_xact_id()
     WHERE c.id = CASE WHEN TG_OP = 'DELETE' THEN OLD.conversation_id
                       ELSE NEW.conversation_id END
       AND c.membership_xid IS DISTINCT FROM pg_current_xact_id();
    RETURN NULL;
END
$$;

CREATE TRIGGER conversation_member_added AFTER INSERT ON conversation_member
    FOR EACH ROW EXECUTE FUNCTION chat_membership_changed();
CREATE TRIGGER conversation_member_removed AFTER DELETE ON conversation_member
    FOR EACH ROW EXECUTE FUNCTION chat_membership_changed();
-- Only an UPDATE that sets `role` fires this, and only when the role changed: the send
-- and read paths' updates of the watermarks never call it.
CREATE TRIGGER conversation_member_role_changed AFTER UPDATE OF role ON conversation_member
    FOR EACH ROW WHEN (OLD.role IS DISTINCT FROM NEW.role)
    EXECUTE FUNCTION chat_membership_changed();

-- Every outbox row is stamped with its conversation's version as its transaction sees it.
-- (aggregateid is the conversation id: every event of chat.events is a conversation's.)
CREATE FUNCTION chat_outbox_stamp() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    SELECT c.membership_version INTO NEW.membership_version
      FROM conversation c WHERE c.id = NEW.aggregateid::BIGINT;
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_stamp BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION chat_outbox_stamp();
