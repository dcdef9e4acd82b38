CREATE OR REPLACE FUNCTION public.chat_thread_unread_apply(p_before_conv bigint[], p_before_user bigint[], p_before_n integer[], p_conversations bigint[], p_roots bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
BEGIN
    UPDATE conversation_member m
       SET unread_threads = m.unread_threads + d.delta,
           changed_xid = pg_current_xact_id()
      FROM (SELECT coalesce(a.conversation_id, b.conv) AS conv,
                   coalesce(a.user_id, b.usr) AS usr,
                   coalesce(a.unread, 0) - coalesce(b.n, 0) AS delta
              FROM chat_thread_unread(p_conversations, p_roots) a
              FULL JOIN unnest(p_before_conv, p_before_user, p_before_n) AS b(conv, usr, n)
                ON b.conv = a.conversation_id AND b.usr = a.user_id) d
     WHERE d.delta <> 0 AND m.conversation_id = d.conv AND m.user_id = d.usr;
END
$function$;
