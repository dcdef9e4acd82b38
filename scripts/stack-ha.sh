# PostgreSQL with a synchronous standby: `scripts/stack up --ha`, `failover`, `switchover`.
# Sourced by scripts/stack (it uses that script's helpers); not a command of its own.
#
# Two PostgreSQL 17 servers on this machine, pg1 (the single node's own cluster,
# $PG_DATA, port $PG_PORT) and pg2 ($DATA_DIR/postgres-2, port $PG_NODE2_PORT); one is
# the primary, the other streams its WAL and is its synchronous standby:
#   synchronous_commit = on, synchronous_standby_names = the other node: a COMMIT (a 201)
#     returns once the standby has flushed its WAL, so it is on two servers;
#   the connector's slot is made with failover on and sync_replication_slots = on keeps a
#     copy on the standby, which a promoted standby streams on from;
#   synchronized_standby_slots = the standby's physical slot: logical decoding sends
#     Debezium nothing the standby has not flushed, so no event on chat.events can be of a
#     transaction a promoted standby never had (a phantom).
# HAProxy (from apt) on $PG_HA_PORT is the one address every client uses (the services,
# Debezium, the tests): it sends each new connection to the node whose health check says
# "primary" (pg_is_in_recovery() is false) and cuts the sessions of a node marked down.
# `scripts/stack failover` and `switchover` do what an orchestrator (Patroni,
# CloudNativePG) does; docs/operations.md#postgresql-with-a-synchronous-standby says how
# they map to those.

PG_HA_MARKER=$DATA_DIR/ha
ha_on() { [ -f "$PG_HA_MARKER" ]; }
ha_name() { echo "pg$1"; }   # node N's application_name and the physical slot it streams from
ha_other() { echo $((3 - $1)); }
ha_data() { if [ "$1" = 1 ]; then echo "$PG_DATA"; else echo "$DATA_DIR/postgres-$1"; fi; }
ha_run() { if [ "$1" = 1 ]; then echo "$PG_RUN"; else echo "$DATA_DIR/postgres-$1-run"; fi; }
ha_port() { if [ "$1" = 1 ]; then echo "$PG_PORT"; else echo "$PG_NODE2_PORT"; fi; }
ha_ctl() { local n=$1; shift; as_pg "'$(pg_bin)/pg_ctl' -D '$(ha_data "$n")' -l '$(ha_run "$n")/postgres.log' -w -t 120 $*"; }
# ha_sql N SQL: psql as the superuser over node N's own socket.
ha_sql() { as_pg "psql -X -q -v ON_ERROR_STOP=1 -h '$(ha_run "$1")' -p $(ha_port "$1") -d postgres -Atc \"$2\""; }
ha_running() { [ -s "$(ha_data "$1")/postmaster.pid" ] && as_pg "'$(pg_bin)/pg_ctl' -D '$(ha_data "$1")' status" >/dev/null 2>&1; }
# ha_state N: primary, standby or down.
ha_state() {
  ha_running "$1" || { echo down; return; }
  ha_sql "$1" "select case when pg_is_in_recovery() then 'standby' else 'primary' end" 2>/dev/null || echo down
}
# ha_primary: the node that is primary; fails unless exactly one is.
ha_primary() {
  local n found=()
  for n in 1 2; do [ "$(ha_state "$n")" = primary ] && found+=("$n"); done
  [ ${#found[@]} = 1 ] || { log "postgres: ${#found[@]} primaries (pg1 $(ha_state 1), pg2 $(ha_state 2))"; return 1; }
  echo "${found[0]}"
}

# ha_conf N on|off: node N's replication settings, for both of its roles (a primary ignores
# the standby's, a standby the primary's). "off" is a primary without a standby: commits
# and logical decoding would wait forever for one, so neither waits (Patroni does the same
# in synchronous_mode when no standby is healthy; synchronous_mode_strict refuses writes).
ha_conf() {
  local n=$1 sync=$2 o; o=$(ha_other "$1")
  local names="" slots=""
  [ "$sync" = off ] || { names=$(ha_name "$o"); slots=$(ha_name "$o"); }
  as_root tee "$(ha_data "$n")/conf.d/ha.conf" >/dev/null <<CONF
# written by scripts/stack --ha: node $(ha_name "$n") of two, synchronous standby $sync
synchronous_commit = on
synchronous_standby_names = '$names'
synchronized_standby_slots = '$slots'
primary_conninfo = 'host=127.0.0.1 port=$(ha_port "$o") user=chatpipe_replica password=$PG_REPLICA_PASSWORD application_name=$(ha_name "$n") dbname=$CHATPIPE_PG_DB connect_timeout=2'
primary_slot_name = '$(ha_name "$n")'
hot_standby = on
hot_standby_feedback = on
sync_replication_slots = on
wal_receiver_timeout = 10s
wal_sender_timeout = 10s
CONF
  as_root chown postgres:postgres "$(ha_data "$n")/conf.d/ha.conf"
}
ha_reload() { if ha_running "$1"; then ha_ctl "$1" reload >/dev/null; fi; }

# ha_configure N: the stack's settings (pg_configure) for node N's directory and port.
ha_configure() { ( PG_DATA=$(ha_data "$1") PG_RUN=$(ha_run "$1") PG_PORT=$(ha_port "$1") pg_configure ); }

ha_start() {
  local n=$1
  ha_running "$n" && return 0
  port_free "$(ha_port "$n")" || die "port $(ha_port "$n") is taken by another process"
  log "postgres: starting $(ha_name "$n") on 127.0.0.1:$(ha_port "$n")"
  ha_ctl "$n" start >/dev/null || { tail -n 20 "$(ha_run "$n")/postgres.log" >&2; die "$(ha_name "$n") did not start"; }
}

# ha_streaming P N: node N streams from primary P (P's pg_stat_replication says so).
ha_streaming() { [ "$(ha_sql "$1" "select count(*) from pg_stat_replication where application_name='$(ha_name "$2")' and state='streaming'")" = 1 ]; }

# The replication login (physical replication and, for slot synchronization, a database
# connection) and the proxy's health-check login (no rights at all).
ha_roles() {
  as_pg "psql -X -q -v ON_ERROR_STOP=1 -h '$(ha_run "$1")' -p $(ha_port "$1") -d postgres" >/dev/null <<SQL
select 'create role chatpipe_replica' where not exists (select 1 from pg_roles where rolname = 'chatpipe_replica') \\gexec
select 'create role chatpipe_probe' where not exists (select 1 from pg_roles where rolname = 'chatpipe_probe') \\gexec
alter role chatpipe_replica login replication password '$PG_REPLICA_PASSWORD';
alter role chatpipe_probe login password '$PG_PROBE_PASSWORD';
SQL
}

# ha_seed N: node N made anew as a standby of the other node, from a base backup taken
# with PostgreSQL's low-level API (the npm server has no pg_basebackup, and Debian's 15
# refuses a 17 server): pg_backup_start, a copy of the data directory, pg_backup_stop's
# backup_label. N's physical slot on the primary, made first, keeps the WAL from the
# backup's start until N streams it. An old primary rejoins this way too (no pg_rewind).
ha_seed() {
  local n=$1 p; p=$(ha_other "$1")
  local dst src; dst=$(ha_data "$n"); src=$(ha_data "$p")
  local t0; t0=$(now)
  if ha_running "$n"; then ha_ctl "$n" stop -m immediate >/dev/null || true; fi
  # A slot of an earlier life of N would hold WAL from then on: made anew.
  ha_sql "$p" "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '$(ha_name "$n")' and not active" >/dev/null
  ha_sql "$p" "select pg_create_physical_replication_slot('$(ha_name "$n")', true)" >/dev/null
  as_root rm -rf "$dst"
  as_root mkdir -p "$dst" "$(ha_run "$n")"
  as_root chown postgres:postgres "$dst" "$(ha_run "$n")"
  as_root chmod 700 "$dst" "$(ha_run "$n")"
  log "postgres: seeding $(ha_name "$n") from $(ha_name "$p") ($(du -sh "$src" 2>/dev/null | cut -f1); pg_backup_start, a copy, pg_backup_stop)"
  # One session: the backup started must be stopped by the session that started it.
  as_pg "psql -X -q -v ON_ERROR_STOP=1 -h '$(ha_run "$p")' -p $(ha_port "$p") -d postgres" >> "$LOG_DIR/ha-seed.log" 2>&1 <<SQL \
    || { tail -n 20 "$LOG_DIR/ha-seed.log" >&2; die "the base backup of $(ha_name "$p") failed"; }
select pg_backup_start('chatpipe $(ha_name "$n")', true);
\! tar -C '$src' --exclude=./postmaster.pid --exclude=./postmaster.opts --exclude=./standby.signal --exclude=./backup_label.old --exclude='./pg_wal/*' --exclude='./pg_replslot/*' --exclude='./pg_stat_tmp/*' -cf - . | tar -C '$dst' -xf -
\pset format unaligned
\pset tuples_only on
\o '$dst/backup_label.tmp'
select labelfile from pg_backup_stop(false);
\o
SQL
  [ -s "$dst/PG_VERSION" ] && [ -s "$dst/backup_label.tmp" ] || die "seeding $(ha_name "$n"): the copy is incomplete (see $LOG_DIR/ha-seed.log)"
  as_pg "printf '%s\n' \"\$(cat '$dst/backup_label.tmp')\" > '$dst/backup_label' && rm '$dst/backup_label.tmp' && touch '$dst/standby.signal'"
  ha_configure "$n"
  ha_conf "$n" on
  ha_start "$n"
  wait_until "$(ha_name "$n") streaming from $(ha_name "$p")" 120 "" ha_streaming "$p" "$n" \
    || { tail -n 20 "$(ha_run "$n")/postgres.log" >&2; die "$(ha_name "$n") does not stream"; }
  log "postgres: $(ha_name "$n") is a standby of $(ha_name "$p"), streaming ($(elapsed "$t0")s)"
}

# ha_is_sync P S: S is P's synchronous standby (P's pg_stat_replication says so).
ha_is_sync() { [ "$(ha_sql "$1" "select sync_state from pg_stat_replication where application_name='$(ha_name "$2")'")" = sync ]; }

# ha_sync_on P: the primary waits for its standby again, once it streams.
ha_sync_on() {
  local p=$1 s; s=$(ha_other "$1")
  ha_conf "$p" on; ha_conf "$s" on
  ha_reload "$p"; ha_reload "$s"
  wait_until "$(ha_name "$s") the synchronous standby of $(ha_name "$p")" 60 "" ha_is_sync "$p" "$s" \
    || die "$(ha_name "$s") did not become synchronous"
}

# ---- the proxy: one address for the primary ---------------------------------------------
ha_proxy_install() {
  command -v haproxy >/dev/null && return 0
  log "postgres: installing HAProxy from apt (the address that follows the primary)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends haproxy >/dev/null
  # Debian starts its own service with /etc/haproxy/haproxy.cfg; ours is a process of the stack.
  as_root sh -c 'command -v systemctl >/dev/null && systemctl disable --now haproxy' >/dev/null 2>&1 || true
}

ha_proxy_up() {
  ha_proxy_install
  mkdir -p "$CONF_OUT"
  # The health check: a node is up for writes when it answers and is not in recovery.
  # HAProxy runs it every second (external-check: a program per check; PostgreSQL's
  # protocol has no check HAProxy speaks that tells a primary from a standby).
  cat > "$CONF_OUT/pg-primary-check" <<CHECK
#!/bin/sh
# HAProxy external check: \$3 \$4 = the server's address and port. Exit 0 = the primary.
r=\$(PGPASSWORD='$PG_PROBE_PASSWORD' PGCONNECT_TIMEOUT=1 psql -X -Atq -h "\$3" -p "\$4" -U chatpipe_probe -d postgres -c 'select pg_is_in_recovery()' 2>/dev/null)
[ "\$r" = f ]
CHECK
  chmod 700 "$CONF_OUT/pg-primary-check"
  cat > "$CONF_OUT/haproxy.cfg" <<CFG
# written by scripts/stack --ha
global
  log stdout format raw local0 info
  external-check
  insecure-fork-wanted
  maxconn 2000
defaults
  mode tcp
  log global
  option tcplog
  timeout connect 2s
  # pooled connections sit idle for minutes; replication and LISTEN-free pools alike
  timeout client 2h
  timeout server 2h
  timeout check 2s
listen postgres-primary
  bind 127.0.0.1:$PG_HA_PORT
  balance first
  option external-check
  external-check path "/usr/bin:/bin"
  external-check command $CONF_OUT/pg-primary-check
  # checked every second (a node down: twice a second); down after 2 failed checks, up after
  # one good one (only a primary passes it); the sessions
  # of a node marked down are cut, so no client keeps writing to a demoted primary
  default-server inter 1s fastinter 250ms downinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
  server pg1 127.0.0.1:$PG_PORT check
  server pg2 127.0.0.1:$PG_NODE2_PORT check
CFG
  if running pg-proxy; then
    if cmp -s "$CONF_OUT/haproxy.cfg" "$RUN_DIR/haproxy.cfg.loaded" 2>/dev/null; then return 0; fi
    stop_component pg-proxy
  fi
  port_free "$PG_HA_PORT" || die "port $PG_HA_PORT is taken by another process"
  log "postgres: HAProxy on 127.0.0.1:$PG_HA_PORT, to whichever of pg1 and pg2 is primary"
  cp "$CONF_OUT/haproxy.cfg" "$RUN_DIR/haproxy.cfg.loaded"
  # The marker in argv[0] is how `running` knows the process is ours.
  start_bg pg-proxy "$STACK_HOME" bash -c 'exec -a "haproxy -Dchatpipe.stack.component=pg-proxy" haproxy -db -f "$0"' "$CONF_OUT/haproxy.cfg"
  wait_until "HAProxy routing to the primary on $PG_HA_PORT" 30 pg-proxy \
    bash -c "PGPASSWORD='$CHATPIPE_PG_PASSWORD' psql -X -Atq -h 127.0.0.1 -p $PG_HA_PORT -U '$CHATPIPE_PG_USER' -d postgres -c 'select 1' >/dev/null 2>&1" \
    || die "HAProxy does not reach the primary (see $LOG_DIR/pg-proxy.out)"
}

# Connect workers read the PostgreSQL address from their environment (${env:CHATPIPE_PG_PORT}):
# a worker started for another address is restarted.
ha_connect_follow() {
  local c pid port
  for c in connect $(cluster_connect_components); do
    running "$c" || continue
    pid=$(cat "$(pidfile "$c")")
    port=$(tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^CHATPIPE_PG_PORT=//p')
    [ "$port" = "$CHATPIPE_PG_PORT" ] && continue
    log "$c: restarting, its PostgreSQL address was port ${port:-?}, now $CHATPIPE_PG_PORT"
    stop_component "$c"
    cmd_start "$c"
  done
}

# ---- commands ------------------------------------------------------------------------------
# Within `up` when the stack is in HA mode, after pg1 is up: the other node, the synchronous
# standby and the proxy, before anything else talks to PostgreSQL.
ha_nodes_up() {
  local n p s
  for n in 1 2; do
    [ -s "$(ha_data "$n")/PG_VERSION" ] || continue
    ha_configure "$n"
    [ -f "$(ha_data "$n")/conf.d/ha.conf" ] || ha_conf "$n" off
    ha_start "$n"
  done
  p=$(ha_primary) || die "no single primary among pg1 and pg2: see their logs in $(ha_run 1) and $(ha_run 2)"
  s=$(ha_other "$p")
  # A primary without its standby must not wait for it while we set things up.
  if ! { [ "$(ha_state "$s")" = standby ] && ha_streaming "$p" "$s"; }; then
    ha_conf "$p" off; ha_reload "$p"
    ha_roles "$p"
    # A standby catches up only over its slot, which kept the WAL it lacks; without one
    # (down --ha drops it) it is seeded anew.
    if [ "$(ha_state "$s")" = standby ] && [ -n "$(ha_sql "$p" "select 1 from pg_replication_slots where slot_name = '$(ha_name "$s")'")" ] &&
       wait_until "$(ha_name "$s") streaming" 30 "" ha_streaming "$p" "$s"; then :; else ha_seed "$s"; fi
  fi
  ha_roles "$p"
  ha_sync_on "$p"
  ha_proxy_up
  log "postgres: $(ha_name "$p") primary, $(ha_name "$s") its synchronous standby; clients use 127.0.0.1:$PG_HA_PORT"
}

cmd_up_ha() {
  mkdir -p "$DATA_DIR"
  touch "$PG_HA_MARKER"
  CHATPIPE_PG_PORT=$PG_HA_PORT
  export CHATPIPE_PG_PORT
  cmd_up
  ha_slots_synced_wait || true
}

# The connector's slot on the standby, synchronized (PostgreSQL copies it once the
# primary's slot has moved past the standby's start; Debezium's heartbeat moves it).
# ha_slots_synced P S: every failover slot of primary P has a copy on standby S that a
# promotion keeps. PostgreSQL makes the copy at once but keeps it temporary (a promotion
# drops it) until the primary's slot has moved past the standby's start: Debezium's
# heartbeat and the server's running-transactions records move it within ~30 s.
# Only slots a connector streams from, or did within the last minute (one reconnecting
# after a failover), count: an idle one (a stopped stack's) never moves, so its copy stays
# temporary; `status --ha` lists it, and a failover loses it.
ha_slots_synced() {
  local want have
  want=$(ha_sql "$1" "select string_agg(slot_name, ' ' order by slot_name) from pg_replication_slots where slot_type = 'logical' and failover and (active or inactive_since > now() - interval '60 seconds')")
  have=$(ha_sql "$2" "select string_agg(slot_name, ' ' order by slot_name) from pg_replication_slots where slot_type = 'logical' and synced and not temporary") || return 1
  # every wanted slot among those held
  local w; for w in $want; do case " $have " in *" $w "*) ;; *) return 1;; esac; done
}
ha_slots_synced_wait() {
  local p s; p=$(ha_primary) || return 1; s=$(ha_other "$p")
  if wait_until "the failover slots synchronized to $(ha_name "$s")" "${HA_SLOT_SYNC_TIMEOUT:-90}" "" ha_slots_synced "$p" "$s"; then
    log "postgres: every failover slot is synchronized to $(ha_name "$s")"
  else
    log "postgres: WARNING: not every failover slot is synchronized to $(ha_name "$s") yet: a failover now would lose the connector's slot"
    return 1
  fi
}

cmd_down_ha() {
  ha_on || { log "postgres: not in HA mode"; return 0; }
  local p; p=$(ha_primary) || die "no single primary; see scripts/stack status --ha"
  if [ "$p" = 2 ]; then
    log "postgres: pg2 is the primary; a switchover first, so that pg1 (the single node) is"
    ha_slots_synced_wait || die "not switching over with a slot that would be lost"
    cmd_switchover
  fi
  ha_conf 1 off; ha_reload 1
  stop_component pg-proxy
  ha_running 2 && ha_ctl 2 stop -m fast >/dev/null
  ha_sql 1 "select pg_drop_replication_slot('pg2') from pg_replication_slots where slot_name = 'pg2'" >/dev/null
  rm -f "$PG_HA_MARKER"
  CHATPIPE_PG_PORT=$PG_PORT
  export CHATPIPE_PG_PORT
  ha_connect_follow
  log "postgres: single node again (pg1 on $PG_PORT); pg2's data is kept in $(ha_data 2)"
}

cmd_status_ha() {
  local n
  for n in 1 2; do
    printf '%-9s %-8s 127.0.0.1:%s  %s\n' "$(ha_name "$n")" "$(ha_state "$n")" "$(ha_port "$n")" "$(ha_data "$n")"
  done
  if running pg-proxy; then printf 'proxy     running  127.0.0.1:%s\n' "$PG_HA_PORT"; else printf 'proxy     stopped\n'; fi
  local p; p=$(ha_primary 2>/dev/null) || return 0
  ha_sql "$p" "select 'standby   '||application_name||' '||state||' '||sync_state||' replay lag '||coalesce(pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)),'-') from pg_stat_replication where application_name in ('pg1', 'pg2')"
  ha_sql "$(ha_other "$p")" "select 'slot      '||slot_name||' on the standby: synced='||synced||' temporary='||temporary||' failover='||failover||' confirmed_flush='||coalesce(confirmed_flush_lsn::text,'-') from pg_replication_slots where slot_type='logical'" 2>/dev/null || true
}

# synchronous on|off: the primary waits for its standby's flush at every commit, or not
# (the standby still streams, asynchronously: a failover may then lose the last commits).
# What Patroni's synchronous_mode switches; the benchmark (scripts/bench-ha) measures both.
cmd_synchronous() {
  ha_on || die "not in HA mode (scripts/stack up --ha)"
  local p; p=$(ha_primary) || die "no single primary"
  case "${1:-}" in
    on) ha_sync_on "$p" ;;
    off) ha_conf "$p" off; ha_reload "$p" ;;
    *) die "synchronous on|off" ;;
  esac
  log "postgres: $(ha_name "$p")'s standby is $(ha_sql "$p" "select coalesce(string_agg(application_name || ' ' || sync_state, ', '), 'none') from pg_stat_replication")"
}

# signal primary|standby STOP|CONT|KILL: the signal to that node's postmaster and every
# process it started (the fault drill's stalls and kills; `rejoin` brings a killed
# standby back). CONT goes to both nodes: a stopped one cannot say what it is.
cmd_signal() {
  ha_on || die "not in HA mode (scripts/stack up --ha)"
  local role=${1:-} sig=${2:-} n pid nodes=()
  case "$role $sig" in
    "primary STOP"|"primary KILL"|"standby STOP"|"standby KILL") for n in 1 2; do [ "$(ha_state "$n")" = "$role" ] && nodes+=("$n"); done ;;
    "primary CONT"|"standby CONT") nodes=(1 2) ;;
    *) die "usage: scripts/stack signal primary|standby STOP|CONT|KILL" ;;
  esac
  [ ${#nodes[@]} -gt 0 ] || die "no running $role"
  for n in "${nodes[@]}"; do
    [ -s "$(ha_data "$n")/postmaster.pid" ] || continue
    pid=$(head -n 1 "$(ha_data "$n")/postmaster.pid")
    kill -0 "$pid" 2>/dev/null || continue
    pkill "-$sig" -P "$pid" 2>/dev/null || true
    kill "-$sig" "$pid"
    log "postgres: SIG$sig to $(ha_name "$n") (postmaster $pid and its processes)"
  done
}

# rejoin: both nodes started, the standby streaming (seeded anew if it cannot catch up),
# synchronous again, the slot copies usable: what `up --ha` does for PostgreSQL alone.
cmd_rejoin() {
  ha_on || die "not in HA mode (scripts/stack up --ha)"
  local t0; t0=$(now)
  ha_nodes_up
  ha_slots_synced_wait || true
  log "postgres: rejoined in $(elapsed "$t0")s"
}

# failover: what an orchestrator does when the primary's machine is lost. The primary is
# killed (SIGKILL of the postmaster and its backends, no shutdown checkpoint), the standby
# promoted and run without a synchronous standby until the old primary is back, then the
# old primary is seeded anew as the new primary's standby (its timeline forked) and
# synchronous replication is on again.
cmd_failover() {
  ha_on || die "not in HA mode (scripts/stack up --ha)"
  local p s t0; p=$(ha_primary) || die "no single primary"; s=$(ha_other "$p"); t0=$(now)
  [ "$(ha_state "$s")" = standby ] || die "$(ha_name "$s") is not a standby"
  local pid; pid=$(head -n 1 "$(ha_data "$p")/postmaster.pid")
  log "failover: SIGKILL of $(ha_name "$p") (postmaster $pid and its processes)"
  pkill -KILL -P "$pid" 2>/dev/null || true
  kill -KILL "$pid"
  wait_until "$(ha_name "$p")'s processes gone" 10 "" bash -c "! kill -0 $pid 2>/dev/null && ! pgrep -P $pid >/dev/null"
  ha_promote "$s" "$t0"
  [ "${HA_REJOIN:-1}" = 1 ] || return 0
  ha_seed "$p"
  ha_sync_on "$s"
  log "failover: $(ha_name "$p") rejoined as the synchronous standby ($(elapsed "$t0")s after the kill)"
  ha_slots_synced_wait || true
}

# ha_timeline N: the timeline node N writes WAL on (a checkpoint's says so only later).
ha_timeline() { ha_sql "$1" "select ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"; }

# ha_promote S T0: the standby promoted, without a standby of its own for now.
ha_promote() {
  local s=$1 t0=$2
  ha_ctl "$s" promote >/dev/null || die "promoting $(ha_name "$s") failed"
  ha_conf "$s" off; ha_reload "$s"
  log "postgres: $(ha_name "$s") promoted to primary (timeline $(ha_timeline "$s"); promoted $(elapsed "$t0")s after the fault); it runs without a synchronous standby until the other node is back"
}

# switchover: a planned move of the primary (maintenance of its machine): the primary
# stops cleanly (a fast shutdown sends the standby every WAL record up to its shutdown
# checkpoint), the standby is promoted, and the old primary follows the new timeline.
cmd_switchover() {
  ha_on || die "not in HA mode (scripts/stack up --ha)"
  local p s t0; p=$(ha_primary) || die "no single primary"; s=$(ha_other "$p"); t0=$(now)
  ha_streaming "$p" "$s" || die "$(ha_name "$s") does not stream: a switchover would lose commits"
  ha_slots_synced "$p" "$s" || die "not every failover slot is synchronized to $(ha_name "$s") (scripts/stack status --ha): a switchover would lose the connector's slot; wait a minute and try again"
  log "switchover: stopping $(ha_name "$p") (fast)"
  ha_ctl "$p" stop -m fast >/dev/null
  ha_promote "$s" "$t0"
  ha_sql "$s" "select pg_create_physical_replication_slot('$(ha_name "$p")', true) where not exists (select 1 from pg_replication_slots where slot_name = '$(ha_name "$p")')" >/dev/null
  as_pg "touch '$(ha_data "$p")/standby.signal'"
  ha_conf "$p" on
  ha_start "$p"
  if ! wait_until "$(ha_name "$p") following the new timeline" 30 "" ha_streaming "$s" "$p"; then
    log "switchover: $(ha_name "$p") cannot follow (see its log); seeding it anew"
    ha_seed "$p"
  fi
  # The old primary's own slots go: the physical one the new primary streamed from (it
  # would keep WAL here for nothing), and its logical slots, which would keep the slot
  # synchronization from making the copies of the new primary's ("same name slot already
  # exists on the standby").
  ha_sql "$p" "select pg_drop_replication_slot(slot_name) from pg_replication_slots where (slot_name = '$(ha_name "$s")' or (slot_type = 'logical' and not synced)) and not active" >/dev/null
  ha_sync_on "$s"
  log "switchover: $(ha_name "$s") primary, $(ha_name "$p") its synchronous standby ($(elapsed "$t0")s)"
  ha_slots_synced_wait || true
}
