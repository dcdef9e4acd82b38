CREATE OR REPLACE FUNCTION public.chat_thread_position(p_conversation bigint, p_root bigint, p_user bigint, p_seq bigint, p_following boolean)
 RETURNS TABLE(last_read_seq bigint, following boolean, unread_threads integer, changed boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_top BIGINT;
    v_live BIGINT;
    v_created INT;
    v_read BIGINT;
    v_following BOOLEAN;
    v_new_read BIGINT;
    v_new_following BOOLEAN;
    v_delta INT;
    v_changed BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_conversation);
    IF NOT EXISTS (SELECT 1 FROM conversation_member m
                    WHERE m.conversation_id = p_conversation AND m.user_id = p_user) THEN
        RETURN;
    END IF;
    -- A top-level message nobody replied to yet can be followed (and read).
    INSERT INTO message_thread (conversation_id, root_seq, root_sender_id)
    SELECT p_conversation, p_root, g.sender_id FROM message g
     WHERE g.conversation_id = p_conversation AND g.seq = p_root
       AND g.thread_root_seq IS NULL AND g.deleted_at IS NULL
    ON CONFLICT DO NOTHING;
    SELECT t.last_reply_seq, t.last_live_seq INTO v_top, v_live FROM message_thread t
     WHERE t.conversation_id = p_conversation AND t.root_seq = p_root;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A new position starts where the thread is: nothing in it is unread to someone
    -- who just started following it (or read it).
    INSERT INTO thread_follow (conversation_id, root_seq, user_id, last_read_seq, following)
    VALUES (p_conversation, p_root, p_user, v_top, false)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_created = ROW_COUNT;
    SELECT f.last_read_seq, f.following INTO v_read, v_following FROM thread_follow f
     WHERE f.conversation_id = p_conversation AND f.root_seq = p_root AND f.user_id = p_user
       FOR UPDATE;
    v_new_read := GREATEST(v_read, LEAST(coalesce(p_seq, v_read), v_top));
    v_new_following := coalesce(p_following, v_following);
    v_changed := v_new_read <> v_read OR v_new_following <> v_following;
    IF v_changed THEN
        UPDATE thread_follow f
           SET last_read_seq = v_new_read, following = v_new_following,
               changed_xid = pg_current_xact_id()
         WHERE f.conversation_id = p_conversation AND f.root_seq = p_root
           AND f.user_id = p_user;
    END IF;
    v_delta := (v_new_following AND v_live > v_new_read)::INT
             - (v_following AND v_live > v_read)::INT;
    -- The member's row carries the change to sync (and the count, if it moved).
    IF v_changed THEN
        RETURN QUERY
        UPDATE conversation_member m
           SET unread_threads = m.unread_threads + v_delta, changed_xid = pg_current_xact_id()
         WHERE m.conversation_id = p_conversation AND m.user_id = p_user
        RETURNING v_new_read, v_new_following, m.unread_threads, true;
    ELSE
        RETURN QUERY
        SELECT v_new_read, v_new_following, m.unread_threads, v_created > 0
          FROM conversation_member m
         WHERE m.conversation_id = p_conversation AND m.user_id = p_user;
    END IF;
END
$function$;
