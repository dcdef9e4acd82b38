-- Delivered ticks: a member's delivery watermark beside the read watermark. Everything up
-- to last_delivered_seq reached one of the member's devices (a client's ack over the
-- WebSocket, or POST /conversations/{id}/delivered). Reading implies delivery: the
-- database holds last_delivered_seq >= last_read_seq for every member, and a trigger
-- moves the delivery watermark up with every read, so no writer of reads (sends, the
-- receipts flush, direct-mode reads, joins) has to remember it.
ALTER TABLE conversation_member ADD COLUMN last_delivered_seq BIGINT NOT NULL DEFAULT 0;
UPDATE conversation_member SET last_delivered_seq = last_read_seq WHERE last_read_seq > 0;
ALTER TABLE conversation_member ADD CONSTRAINT conversation_member_delivered_covers_read
    CHECK (last_delivered_seq >= last_read_seq);
-- "Delivered to N" = members with last_delivered_seq >= seq: a range count, as for reads.
CREATE INDEX conversation_member_delivered_idx
    ON conversation_member (conversation_id, last_delivered_seq);

CREATE FUNCTION chat_read_implies_delivered() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_delivered_seq < NEW.last_read_seq THEN
        NEW.last_delivered_seq := NEW.last_read_seq;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER conversation_member_read_implies_delivered
    BEFORE INSERT OR UPDATE OF last_read_seq ON conversation_member
    FOR EACH ROW EXECUTE FUNCTION chat_read_implies_delivered();
