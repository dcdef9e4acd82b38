CREATE OR REPLACE FUNCTION public.chat_read_implies_delivered()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.last_delivered_seq < NEW.last_read_seq THEN
        NEW.last_delivered_seq := NEW.last_read_seq;
    END IF;
    RETURN NEW;
END
$function$;
