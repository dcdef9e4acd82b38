CREATE OR REPLACE FUNCTION public.chat_thread_unread(p_conversations bigint[], p_roots bigint[])
 RETURNS TABLE(conversation_id bigint, user_id bigint, unread integer)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT f.conversation_id, f.user_id, count(*)::INT
      FROM unnest(p_conversations, p_roots) AS r(conv, root)
      JOIN message_thread t ON t.conversation_id = r.conv AND t.root_seq = r.root
      JOIN thread_follow f ON f.conversation_id = r.conv AND f.root_seq = r.root
     WHERE f.following AND t.last_live_seq > f.last_read_seq
     GROUP BY f.conversation_id, f.user_id
$function$;
