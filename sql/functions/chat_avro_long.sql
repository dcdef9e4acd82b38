CREATE OR REPLACE FUNCTION public.chat_avro_long(n bigint)
 RETURNS bytea
 LANGUAGE plpgsql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
DECLARE
    z   NUMERIC := CASE WHEN n >= 0 THEN 2 * n::NUMERIC ELSE -2 * n::NUMERIC - 1 END;
    out BYTEA   := '';
    b   INTEGER;
BEGIN
    LOOP
        b := mod(z, 128)::INTEGER;
        z := div(z, 128);
        IF z = 0 THEN
            RETURN out || set_byte('\x00'::BYTEA, 0, b);
        END IF;
        out := out || set_byte('\x00'::BYTEA, 0, b + 128);
    END LOOP;
END
$function$;
