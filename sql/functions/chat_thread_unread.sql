CREATE OR REPLACE FUNCTION public.chat_thread_unread(p_conversations bigint[], p_roots bigint[])
 RETURNS TABLE(conversation_id bigint, user_id bigint, unread integer)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT f.conversation_id, f.user_id, count(*)::INT
      FROM unnest(p_conversations, p_roots) AS r(conv, root)
      CROSS JOIN LATERAL (
            SELECT t.last_live_seq FROM message_thread t
             WHERE t.conversation_id = r.conv AND t.root_seq = r.root
             OFFSET 0) t
      CROSS JOIN LATERAL (
            SELECT f.conversation_id, f.user_id FROM thread_follow f
             WHERE f.conversation_id = r.conv AND f.root_seq = r.root
               AND f.following AND t.last_live_seq > f.last_read_seq
             OFFSET 0) f
     GROUP BY f.conversation_id, f.user_id
$function$;
