CREATE OR REPLACE FUNCTION public.chat_outbox_write(p_ids uuid[], p_aggregatetype text, p_keys text[], p_types text[], p_payloads bytea[], p_clear boolean, p_traceparents text[] DEFAULT NULL::text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent)
    SELECT e.i, p_aggregatetype, e.k, e.t, e.p, e.tp
      FROM unnest(p_ids, p_keys, p_types, p_payloads, p_traceparents)
           WITH ORDINALITY AS e(i, k, t, p, tp, n)
     ORDER BY e.n;
    IF p_clear THEN
        DELETE FROM outbox o WHERE o.id = ANY (p_ids);
    END IF;
END
$function$;
