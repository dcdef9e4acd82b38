CREATE OR REPLACE FUNCTION public.chat_outbox_stamp()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    SELECT c.membership_version INTO NEW.membership_version
      FROM conversation c WHERE c.id = NEW.aggregateid::BIGINT;
    RETURN NEW;
END
$function$;
