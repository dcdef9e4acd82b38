//! The root cause of the broker-restart stall (librdkafka#5301; the defect and the
//! remedy are described in `core/src/kafka/rebootstrap.rs`). A KRaft broker that was
//! stopped for longer than `broker.session.timeout.ms` may be fenced when it resumes
//! (its controller's session check can run before its own heartbeat: one 15 s stall in
//! two to four here), and then for a moment it answers Metadata with no brokers and every
//! leader unknown. A librdkafka client that has learned the broker drops every broker it
//! knows on that answer and, unguarded, may never ask anyone again (seen here: one to
//! four of eight plain clients stranded after such a stall, none of the guarded ones). Every client of ours is made by
//! `chatpipe_core::kafka::create`, which gives such a client its bootstrap servers back.
//!
//! The test runs guarded clients beside plain librdkafka ones (the control: made with
//! `ClientConfig::create`, as every client of ours was before), each asking for
//! metadata without pause so that some ask while the broker is fenced.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_core::kafka::Rebootstrap;
use chatpipe_tests::stream::{brokers, create_topic};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{ClientConfig, ClientContext};

use crate::{one_fault_at_a_time, signal, stack_pid, StartOnPanic};

/// Longer than the broker's `broker.session.timeout.ms` (9 s): it is fenced on resume.
const STALL: Duration = Duration::from_secs(15);
/// Clients of each kind.
const CLIENTS: usize = 8;
/// What a guarded client may take to find the broker again after it resumed: a
/// statistics interval (1 s) to notice, then a connection and a metadata answer.
const RECOVERY: Duration = Duration::from_secs(10);
/// How long the control clients are watched after the broker resumed.
const CONTROL_WAIT: Duration = Duration::from_secs(30);

/// What a test client saw in librdkafka's metadata log (`debug=metadata`).
#[derive(Default)]
struct Seen {
    /// Metadata answers that listed no broker, received from a broker the client had
    /// learned (`…/1: 0 brokers, 1 topics`): the answer that strands a client.
    brokerless_from_learned: AtomicUsize,
}

/// A test client's context: it counts broker-less answers and, when guarded, passes
/// its statistics to the guard as every client of ours does.
struct Watch {
    guard: Option<Rebootstrap>,
    seen: Arc<Seen>,
}

impl ClientContext for Watch {
    fn log(&self, _: RDKafkaLogLevel, _: &str, line: &str) {
        // "127.0.0.1:9092/1: 0 brokers, 1 topics"; from a bootstrap broker it reads
        // "127.0.0.1:9092/bootstrap: 0 brokers, …", which strands nobody.
        if let Some((from, _)) = line.split_once(": 0 brokers, ") {
            let learned = from
                .rsplit_once('/')
                .is_some_and(|(_, id)| id.parse::<i32>().is_ok());
            if learned {
                self.seen
                    .brokerless_from_learned
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        if let Some(guard) = &self.guard {
            guard.observe(&statistics);
        }
    }
}

impl ConsumerContext for Watch {}

/// One client, asking for its topic's metadata on a thread of its own until told to
/// stop; remembers when it last had an answer that named a broker and a leader.
struct Asker {
    name: String,
    seen: Arc<Seen>,
    /// Since when the test watches, and the first good answer after it.
    good: Arc<Mutex<(Instant, Option<Instant>)>>,
    thread: std::thread::JoinHandle<()>,
}

impl Asker {
    fn new(
        name: String,
        guarded: bool,
        config: &ClientConfig,
        topic: &str,
        stop: &Arc<AtomicBool>,
    ) -> Self {
        let seen = Arc::new(Seen::default());
        let client: BaseConsumer<Watch> = if guarded {
            chatpipe_core::kafka::create_with(config, |guard| Watch {
                guard: Some(guard),
                seen: seen.clone(),
            })
            .expect("a guarded client")
        } else {
            #[allow(clippy::disallowed_methods)] // the control: a client without the guard
            let client = config
                .create_with_context(Watch {
                    guard: None,
                    seen: seen.clone(),
                })
                .expect("a plain client");
            client
        };
        let good = Arc::new(Mutex::new((Instant::now(), None)));
        let (first_good, topic, stop) = (good.clone(), topic.to_owned(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Statistics and log callbacks are served from polls (one queue for
                // both): 20 ms of it between questions keeps up with debug logging.
                let _ = client.poll(Duration::from_millis(20));
                let good = client
                    .fetch_metadata(Some(&topic), Duration::from_secs(1))
                    .is_ok_and(|m| {
                        !m.brokers().is_empty()
                            && m.topics()
                                .iter()
                                .all(|t| t.partitions().iter().all(|p| p.leader() >= 0))
                    });
                if good {
                    let mut g = first_good.lock().unwrap();
                    if g.1.is_none() {
                        g.1 = Some(Instant::now());
                    }
                }
            }
        });
        Asker {
            name,
            seen,
            good,
            thread,
        }
    }

    /// Watches for the first good answer from now on.
    fn watch(&self) {
        *self.good.lock().unwrap() = (Instant::now(), None);
    }

    /// How long after [`Self::watch`] the client had its first good answer; None: not
    /// yet.
    fn recovered(&self) -> Option<Duration> {
        let (since, first) = *self.good.lock().unwrap();
        first.map(|t| t - since)
    }

    fn brokerless(&self) -> usize {
        self.seen.brokerless_from_learned.load(Ordering::Relaxed)
    }
}

/// Stalls the broker for [`STALL`] (then resumes it) until a guarded client has had a
/// broker-less answer from its learned broker, at most this many times. The fence is a
/// race (one stall in two to four here; one CI run on 2026-12-04 saw none in five, and
/// so failed for want of the fault, not for a stranded client): twelve stalls of about
/// 17 s each leave it unreproduced about once in 30 runs at the worst rate seen.
const ATTEMPTS: usize = 12;

#[tokio::test]
async fn a_fenced_broker_that_lists_no_brokers_strands_no_client_of_ours() {
    let _turn = one_fault_at_a_time().await;
    let topic = format!("fenced-{}", uuid::Uuid::new_v4());
    create_topic(&topic, 3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let config = chatpipe_core::kafka::client_config(&brokers())
        .set("group.id", format!("{topic}-askers"))
        .set("debug", "metadata")
        // librdkafka drops debug lines unless the log level lets them through.
        .set_log_level(RDKafkaLogLevel::Debug)
        .clone();
    let mut guarded = Vec::new();
    let mut plain = Vec::new();
    for i in 0..CLIENTS {
        guarded.push(Asker::new(
            format!("guarded-{i}"),
            true,
            &config,
            &topic,
            &stop,
        ));
        plain.push(Asker::new(
            format!("plain-{i}"),
            false,
            &config,
            &topic,
            &stop,
        ));
    }
    let _restart = StartOnPanic::new("kafka");
    let pid = stack_pid("kafka");
    let mut stranded_plain = 0;
    let mut attempt = 0;
    while guarded.iter().all(|a| a.brokerless() == 0) {
        attempt += 1;
        assert!(
            attempt <= ATTEMPTS,
            "no guarded client got a broker-less metadata answer from its learned broker in {ATTEMPTS} stalls of {STALL:?}: the test did not exercise the defect"
        );
        // Every guarded client has a broker before the stall. A plain one may not (the
        // first stall strands it for good before the control is read below, or a
        // later answer does): it is the defect, and it is reported, not waited for.
        let ready = Instant::now();
        guarded.iter().chain(&plain).for_each(Asker::watch);
        while guarded.iter().any(|a| a.recovered().is_none()) {
            let waiting: Vec<&str> = guarded
                .iter()
                .filter(|a| a.recovered().is_none())
                .map(|a| a.name.as_str())
                .collect();
            assert!(
                ready.elapsed() < RECOVERY,
                "every guarded client reached the broker before stall {attempt}; not: {waiting:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        signal("-STOP", pid);
        tokio::time::sleep(STALL).await;
        signal("-CONT", pid);
        let resumed = Instant::now();
        guarded.iter().chain(&plain).for_each(Asker::watch);
        while resumed.elapsed() < CONTROL_WAIT
            && guarded
                .iter()
                .chain(&plain)
                .any(|a| a.recovered().is_none())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let report = |askers: &[Asker]| -> Vec<String> {
            askers
                .iter()
                .map(|a| match a.recovered() {
                    Some(d) => format!(
                        "{} {:.1} s ({} broker-less)",
                        a.name,
                        d.as_secs_f64(),
                        a.brokerless()
                    ),
                    None => format!("{} stranded ({} broker-less)", a.name, a.brokerless()),
                })
                .collect()
        };
        let (guarded_report, plain_report) = (report(&guarded), report(&plain));
        eprintln!("stall {attempt}: guarded: {guarded_report:?}");
        eprintln!("stall {attempt}: control (no guard): {plain_report:?}");
        assert!(
            guarded
                .iter()
                .all(|a| a.recovered().is_some_and(|d| d <= RECOVERY)),
            "every guarded client found the broker within {RECOVERY:?} of its return: {guarded_report:?}"
        );
        stranded_plain = plain.iter().filter(|a| a.recovered().is_none()).count();
        if stranded_plain > 0 {
            // The control is stranded for good: later stalls would prove nothing of it.
            break;
        }
    }
    eprintln!("{stranded_plain} of {CLIENTS} plain clients stranded");
    stop.store(true, Ordering::Relaxed);
    for a in guarded.into_iter().chain(plain) {
        a.thread.join().expect("asker thread");
    }
}
