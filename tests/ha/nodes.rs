//! The two PostgreSQL servers, each asked directly (not through the proxy): which is the
//! primary, and which slots have copies a promotion keeps.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chatpipe_tests::stream::Pipeline;
use sqlx::PgPool;

/// The two servers (host:port), from `scripts/stack env` in HA mode.
pub fn nodes() -> Vec<String> {
    let v = std::env::var("CHATPIPE_PG_NODES").unwrap_or_default();
    let nodes: Vec<String> = v
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(
        nodes.len(),
        2,
        "CHATPIPE_PG_NODES={v:?}: these tests need PostgreSQL with a standby. Run `scripts/stack up --ha` and `eval \"$(scripts/stack env)\"`"
    );
    nodes
}

/// `url` pointed at `node` (host:port) instead of the proxy.
fn at_node(url: &str, node: &str) -> String {
    let mut u = url::Url::parse(url).expect("a database URL");
    let (host, port) = node.split_once(':').expect("host:port");
    u.set_host(Some(host)).unwrap();
    u.set_port(Some(port.parse().expect("a port"))).unwrap();
    u.to_string()
}

/// One server, asked directly (not through the proxy).
pub struct Node {
    pub addr: String,
    pub pool: PgPool,
}

impl Node {
    async fn connect(database_url: &str, addr: &str) -> Self {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&at_node(database_url, addr))
            .expect("a pool");
        Self {
            addr: addr.to_owned(),
            pool,
        }
    }

    /// `Some(true)` for a standby, `Some(false)` for a primary, `None` when it does not
    /// answer.
    async fn in_recovery(&self) -> Option<bool> {
        sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&self.pool)
            .await
            .ok()
    }

    /// Names of the slots a query on `pg_replication_slots` selects.
    async fn slots(&self, filter: &str) -> BTreeSet<String> {
        sqlx::query_scalar::<_, String>(&format!(
            "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'logical' AND {filter}"
        ))
        .fetch_all(&self.pool)
        .await
        .map(|v| v.into_iter().collect())
        .unwrap_or_default()
    }
}

/// The failover slots a connector streams from on `primary` (the test's own and the
/// stack's), each with a copy on `standby` that a promotion keeps: what must hold before
/// the primary may go, or a connector loses its position. Waits for it.
pub async fn slots_synchronized(primary: &Node, standby: &Node, must_include: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let streamed = primary.slots("failover AND active").await;
        let usable = standby.slots("synced AND NOT temporary").await;
        if streamed.contains(must_include) && streamed.is_subset(&usable) {
            eprintln!(
                "slots {streamed:?} synchronized to the standby {}",
                standby.addr
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "failover slots {streamed:?} on the primary {} (must include {must_include}); usable copies on the standby {}: {usable:?}",
            primary.addr,
            standby.addr
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The test's database on both servers, primary first.
pub async fn primary_and_standby(p: &Pipeline) -> (Node, Node) {
    let [a, b]: [String; 2] = nodes().try_into().unwrap();
    let (a, b) = (
        Node::connect(&p.database_url, &a).await,
        Node::connect(&p.database_url, &b).await,
    );
    match (a.in_recovery().await, b.in_recovery().await) {
        (Some(false), Some(true)) => (a, b),
        (Some(true), Some(false)) => (b, a),
        other => panic!(
            "one primary and one standby expected ({}, {}): {other:?}",
            a.addr, b.addr
        ),
    }
}
