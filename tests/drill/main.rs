//! The short fault drill (three faults, 40 s of load after each), as CI runs it: two of
//! every service of ours on the real stack, 200 WebSocket clients, and nothing lost.
//! Its own test binary: the faults hit the shared stack. The full drill is
//! `scripts/drill`.

use std::path::PathBuf;
use std::time::Duration;

use chatpipe_tests::drill::faults::{Durations, Fault};
use chatpipe_tests::drill::services::Bins;
use chatpipe_tests::drill::{run, Config};

fn bin(var: &str) -> PathBuf {
    PathBuf::from(std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the suite with scripts/test, which builds the services")
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_drill_of_three_faults_under_load_loses_nothing() {
    chatpipe_tests::watchdog::arm();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned();
    let rows = run(Config {
        faults: Fault::SHORT.to_vec(),
        settle: Duration::from_secs(40),
        // Pushes are back 25 s after a fault ends (the broker tests saw at most 16 s),
        // and counted per gateway over the next 10 s (the settle's last 5 are in flight).
        push_recovery: Duration::from_secs(25),
        users: 200,
        conversations: 40,
        send_rate: 20,
        read_rate: 5,
        durations: Durations {
            broker_stall: Duration::from_secs(90),
            registry_down: Duration::from_secs(60),
            restart_after: Duration::from_secs(5),
            node_down: Duration::from_secs(30),
            pg_stall: Duration::from_secs(30),
            standby_grace: Duration::from_secs(10),
        },
        bins: Bins {
            ingest_api: bin("CHATPIPE_INGEST_API_BIN"),
            pipeline: bin("CHATPIPE_PIPELINE_BIN"),
            gateway: bin("CHATPIPE_GATEWAY_BIN"),
        },
        out: repo.join("target/drill-short"),
        repo,
    })
    .await;
    assert_eq!(
        rows.len(),
        Fault::SHORT.len() + 2,
        "warm-up, each fault, the end"
    );
    for r in &rows {
        assert!(
            r.failures().is_empty(),
            "{} failed: {:?}; {r:#?}",
            r.fault,
            r.failures()
        );
        assert!(
            r.acked_in_phase > 0 || r.fault.starts_with("end"),
            "no sends acknowledged in {}",
            r.fault
        );
    }
    let end = rows.last().unwrap();
    assert!(
        end.metric_gaps.is_empty(),
        "every metric of every service has HELP, each says its build, and every counter an alert reads is exported: {:#?}",
        end.metric_gaps
    );
    assert!(
        end.acked >= 100,
        "the load ran: {} sends acknowledged",
        end.acked
    );
    let kill_gateway = &rows[3];
    assert!(
        kill_gateway.reconnects > 0,
        "the killed gateway's clients reconnected: {kill_gateway:#?}"
    );
}
