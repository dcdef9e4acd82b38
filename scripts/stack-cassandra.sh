# Apache Cassandra, one node: `scripts/stack up` starts it, `start|restart|down cassandra`.
# Sourced by scripts/stack (it uses that script's helpers); not a command of its own.
#
# The server runs from the jars of org.apache.cassandra:cassandra-all on Maven Central
# (config/stack/poms/cassandra-pom.xml; apache.org's tarball mirrors are not reachable
# here), on Java 17 (5.0 fails on 25), with what bin/cassandra and conf/jvm17-server.options
# would give it, written out below:
#   config/stack/cassandra.yaml, rendered into $CONF_OUT/cassandra/: 127.0.0.1 only, one
#     token, SimpleSnitch ("datacenter1"), no logins, commitlog_sync batch (an acknowledged
#     write survives kill -9);
#   config/stack/cassandra-logback.xml: $LOG_DIR/cassandra.log, WARN and above also in
#     cassandra.out;
#   data, commit log, hints and caches under $DATA_DIR/cassandra (`scripts/stack reset`
#     wipes them).
# As root, Cassandra's mlockall() pins its whole heap and reserved memory (~1 GiB RSS);
# without CAP_IPC_LOCK (capsh) the call fails harmlessly and RSS is about half that.
# Ready when CQL (CASSANDRA_PORT) accepts connections: Cassandra opens it last.
# docs/operations.md#cassandra-on-the-stack has what was measured.

CASSANDRA_LIB=$STACK_CACHE/cassandra-$CASSANDRA_VERSION/lib
CASSANDRA_DATA=$DATA_DIR/cassandra
CASSANDRA_CONF=$CONF_OUT/cassandra
export CASSANDRA_VERSION  # config/stack/poms/cassandra-pom.xml reads ${env.CASSANDRA_VERSION}

cassandra_download() {
  mvn_copy_deps "$CONFIG_DIR/poms/cassandra-pom.xml" "$CASSANDRA_LIB"
}

# capsh (Debian's libcap2-bin) drops CAP_IPC_LOCK for root; other users have none to drop.
cassandra_capsh() {
  [ "$(id -u)" = 0 ] || return 0
  if command -v capsh >/dev/null || [ -x /usr/sbin/capsh ]; then return 0; fi
  log "cassandra: installing capsh from apt (libcap2-bin: Cassandra runs without CAP_IPC_LOCK, or mlockall pins ~1 GiB)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq libcap2-bin >/dev/null
}

# cassandra_start: renders the config and starts the node unless it runs; does not wait.
cassandra_start() {
  CASSANDRA_T0=""
  if running cassandra; then log "cassandra: already running (pid $(cat "$(pidfile cassandra)"))"; return 0; fi
  local p
  for p in "$CASSANDRA_PORT" "$CASSANDRA_STORAGE_PORT" "$CASSANDRA_SSL_STORAGE_PORT" "$CASSANDRA_JMX_PORT"; do
    port_free "$p" || die "port $p (cassandra) is taken by another process"
  done
  [ -f "$CASSANDRA_LIB/.complete" ] || cassandra_download
  local jamm; jamm=$(find "$CASSANDRA_LIB" -maxdepth 1 -name 'jamm-*.jar' | head -n 1)
  [ -n "$jamm" ] || die "cassandra: no jamm jar in $CASSANDRA_LIB (the -javaagent Cassandra measures memtables with)"
  cassandra_capsh
  mkdir -p "$CASSANDRA_CONF/triggers" "$LOG_DIR"
  mkdir -p "$CASSANDRA_DATA"/{data,commitlog,saved_caches,hints,cdc_raw}
  ( export CASSANDRA_DATA CASSANDRA_PORT CASSANDRA_STORAGE_PORT CASSANDRA_SSL_STORAGE_PORT
    render "$CONFIG_DIR/cassandra.yaml" "$CASSANDRA_CONF/cassandra.yaml" )
  # capsh runs `/bin/bash -c 'exec "$0" "$@"' java …`: no fork, so the pid start_bg
  # wrote becomes the JVM's.
  local wrap=()
  # shellcheck disable=SC2016
  if [ "$(id -u)" = 0 ]; then wrap=("$(command -v capsh || echo /usr/sbin/capsh)" --drop=cap_ipc_lock -- -c 'exec "$0" "$@"'); fi
  CASSANDRA_T0=$(now)
  log "cassandra: starting $CASSANDRA_VERSION on 127.0.0.1:$CASSANDRA_PORT (CQL; storage $CASSANDRA_STORAGE_PORT, JMX $CASSANDRA_JMX_PORT, -Xmx$CASSANDRA_HEAP)"
  start_bg cassandra "$CASSANDRA_DATA" "${wrap[@]}" "$JAVA17" -Dchatpipe.stack.component=cassandra \
    -Xms256m -Xmx"$CASSANDRA_HEAP" -Xss256k \
    -XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxTenuringThreshold=1 -XX:G1HeapRegionSize=16m \
    -XX:G1RSetUpdatingPauseTimePercent=5 -XX:MaxGCPauseMillis=300 -XX:InitiatingHeapOccupancyPercent=70 \
    -XX:+UseThreadPriorities -XX:+HeapDumpOnOutOfMemoryError -XX:HeapDumpPath="$CASSANDRA_DATA" \
    -XX:+ExitOnOutOfMemoryError -XX:+PerfDisableSharedMem -XX:+UseTLAB -XX:+ResizeTLAB \
    -ea -da:net.openhft... \
    -Djava.net.preferIPv4Stack=true -Djdk.attach.allowAttachSelf=true \
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED \
    --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED \
    --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED \
    --add-exports java.sql/java.sql=ALL-UNNAMED \
    --add-exports java.base/java.lang.ref=ALL-UNNAMED \
    --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED \
    --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED \
    --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED \
    --add-opens java.base/java.lang.module=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.loader=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.math=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.module=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED \
    --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
    --add-opens java.base/java.io=ALL-UNNAMED \
    --add-opens java.base/java.lang.reflect=ALL-UNNAMED \
    --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED \
    --add-opens java.base/java.util=ALL-UNNAMED \
    -Dio.netty.tryReflectionSetAccessible=true -Dio.netty.allocator.useCacheForAllThreads=true \
    -Dio.netty.allocator.maxOrder=11 \
    -javaagent:"$jamm" \
    -Dcassandra.jmx.local.port="$CASSANDRA_JMX_PORT" -Dcom.sun.management.jmxremote.authenticate=false \
    -Dcassandra.config="file://$CASSANDRA_CONF/cassandra.yaml" \
    -Dlogback.configurationFile="file://$CONFIG_DIR/cassandra-logback.xml" \
    -Dcassandra.logdir="$LOG_DIR" -Dcassandra.storagedir="$CASSANDRA_DATA" \
    -Dcassandra.triggers_dir="$CASSANDRA_CONF/triggers" \
    -Dcassandra.shutdown_announce_in_ms=0 -Dcassandra-foreground=yes \
    -cp "$CASSANDRA_CONF:$CASSANDRA_LIB/*" org.apache.cassandra.service.CassandraDaemon
}

# cassandra_wait: until CQL accepts connections (the last thing a starting node opens).
cassandra_wait() {
  wait_until "cassandra CQL on $CASSANDRA_PORT" "$CASSANDRA_START_TIMEOUT" cassandra port_open "$CASSANDRA_PORT" \
    || die "cassandra did not start (see $LOG_DIR/cassandra.log)"
  if [ -n "${CASSANDRA_T0:-}" ]; then log "cassandra: ready in $(elapsed "$CASSANDRA_T0")s (CQL 127.0.0.1:$CASSANDRA_PORT)"
  else log "cassandra: ready (CQL 127.0.0.1:$CASSANDRA_PORT)"; fi
}

cassandra_up() {
  cassandra_start
  cassandra_wait
}
