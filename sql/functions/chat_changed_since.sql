CREATE OR REPLACE FUNCTION public.chat_changed_since(xid xid8, cursor pg_snapshot)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT xid IS NOT NULL AND NOT pg_visible_in_snapshot(xid, cursor) $function$;
