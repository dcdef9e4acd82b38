# Re-publishing the outbox: `scripts/stack republish-outbox [--no-wait]`.
# Sourced by scripts/stack (it uses that script's helpers); not a command of its own.
#
# With outbox.retain_until_confirmed (the default) every outbox row stays until the
# auditor has read its event on chat.events. When the WAL that carried some events is
# lost (the replication slot dropped by hand, a restore from backup, a failover to a
# server without a copy of the slot), the connector fails (`… no longer available on the
# server`) or streams on from a new slot, and the rows of the lost events are still in
# the table. This publishes them again, in the order they were written:
#   1. the slot exists (made with failover on if it was dropped);
#   2. Connect forgets the connector's offsets and the connector streams from the slot's
#      position (what the slot has not confirmed may come twice; consumers dedupe);
#   3. a Debezium incremental snapshot of public.outbox, asked through the signalling
#      table (signal.data.collection), chunked by `position` (the order rows were
#      written, so each conversation's events come again in seq order);
#   4. it waits until the auditor has confirmed (deleted) every row that was there when
#      it asked: the events are all on chat.events.
# docs/operations.md#re-publishing-the-outbox says when to run it and what one sees.

REPUBLISH_TIMEOUT=${REPUBLISH_TIMEOUT:-600}

# outbox_sql SQL: a value from the chatpipe database, as its owner.
outbox_sql() { psql_db -d "$CHATPIPE_PG_DB" -Atc "$1"; }
outbox_slot_active() { [ "$(outbox_sql "select active from pg_replication_slots where slot_name = '$SLOT_NAME'")" = t ]; }

cmd_republish_outbox() {
  local wait=1
  case ${1:-} in --no-wait) wait=0 ;; "") ;; *) die "usage: scripts/stack republish-outbox [--no-wait]" ;; esac
  curl -fs -o /dev/null --max-time 3 "$(connect_url)/health" || die "Kafka Connect does not answer at $(connect_url)"
  local t0 last rows c signal
  t0=$(now)
  last=$(outbox_sql "select coalesce(max(position), 0) from outbox") || die "PostgreSQL does not answer"
  rows=$(outbox_sql "select count(*) from outbox")
  log "outbox: $rows rows not confirmed on chat.events (positions up to $last)"

  failover_slot "$SLOT_NAME"
  c="$(connect_url)/connectors/$CONNECTOR_NAME"
  curl -fsS -o /dev/null -X PUT "$c/stop" || die "stopping $CONNECTOR_NAME failed"
  wait_until "connector STOPPED" 60 "" bash -c "curl -fs '$c/status' | grep -q '\"state\":\"STOPPED\"'" \
    || die "connector did not stop"
  log "connect: offsets of $CONNECTOR_NAME were $(curl -fsS "$c/offsets")"
  curl -fsS -o /dev/null -X DELETE "$c/offsets" || die "DELETE offsets failed"
  curl -fsS -o /dev/null -X PUT "$c/resume" || die "resume failed"
  wait_until "connector $CONNECTOR_NAME RUNNING from the slot" "$CONNECTOR_TIMEOUT" "" connector_running \
    || die "connector $CONNECTOR_NAME is $(connector_state): $(curl -fsS "$c/status" | cut -c1-1500)"
  # A RUNNING task may not yet stream: the signal must be in the WAL after the position
  # it streams from, so wait until the slot has its client.
  wait_until "slot $SLOT_NAME active" "$CONNECTOR_TIMEOUT" "" outbox_slot_active || die "no client on slot $SLOT_NAME"

  # The signal goes into the WAL after the slot's position: the connector reads it.
  signal="republish-$(date -u +%Y%m%dT%H%M%SZ)-$$"
  outbox_sql "insert into debezium_signal (id, type, data) values ('$signal', 'execute-snapshot',
      '{\"data-collections\": [\"public.outbox\"], \"type\": \"incremental\", \"surrogate-key\": \"position\"}')" >/dev/null \
    || die "could not write the signal"
  log "connect: incremental snapshot of public.outbox asked (signal $signal)"
  [ "$wait" = 1 ] || return 0
  [ "$rows" != 0 ] || { log "outbox: nothing to confirm ($(elapsed "$t0")s)"; return 0; }
  # The auditor deletes each row once it read the row's event; until then it is left.
  local left deadline=$((SECONDS + REPUBLISH_TIMEOUT)) said=""
  while :; do
    left=$(outbox_sql "select count(*) from outbox where position <= $last") || left="?"
    [ "$left" = 0 ] && break
    [ $SECONDS -lt $deadline ] || die "after ${REPUBLISH_TIMEOUT}s $left of $rows rows are not confirmed: is the auditor (pipeline audit) reading chat.events? Connect's log: $LOG_DIR/connect.log"
    [ "$left" = "$said" ] || { log "outbox: $left of $rows rows not yet confirmed"; said=$left; }
    sleep 1
  done
  log "outbox: all $rows rows published again and confirmed by the auditor ($(elapsed "$t0")s)"
}
