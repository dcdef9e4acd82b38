CREATE OR REPLACE FUNCTION public.chat_membership_changed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE conversation c
       SET membership_version = c.membership_version + 1,
           membership_xid = pg_current_xact_id()
     WHERE c.id = CASE WHEN TG_OP = 'DELETE' THEN OLD.conversation_id
                       ELSE NEW.conversation_id END
       AND c.membership_xid IS DISTINCT FROM pg_current_xact_id();
    RETURN NULL;
END
$function$;
