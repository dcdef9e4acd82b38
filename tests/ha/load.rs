//! Sends into many conversations, one after another in each, as a client must send: a
//! send that fails (503 while the primary moves, a cut connection) is retried with the
//! same clientMsgId until it is answered 201, or 200 when an earlier try was committed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_tests::stream::Pipeline;
use serde_json::json;

/// One acknowledged message: (conversation, seq), its body, when it was answered.
type Acked = ((i64, i64), String, Instant);

pub struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    failed: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

pub struct Report {
    /// (conversation, seq) and body of every acknowledged send.
    pub acked: Vec<((i64, i64), String)>,
    pub failed_attempts: usize,
}

impl Load {
    /// One sender per conversation, a send every `every`.
    pub fn start(p: &Pipeline, sender: i64, conversations: &[i64], every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicUsize::new(0));
        let tasks = conversations
            .iter()
            .map(|&c| {
                let (http, token) = (p.app.http.clone(), p.app.token(sender));
                let url = format!("{}/v1/conversations/{c}/messages", p.app.base);
                let (stop, acked, failed) = (stop.clone(), acked.clone(), failed.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let body = format!("c{c} m{n}");
                        let msg = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": body});
                        let seq = loop {
                            match http.post(&url).bearer_auth(&token).json(&msg).send().await {
                                Ok(res) if res.status() == 201 || res.status() == 200 => {
                                    let v: serde_json::Value = res.json().await.unwrap();
                                    break v["seq"].as_i64().expect("a seq");
                                }
                                Ok(res) if res.status() == 503 => {}
                                Ok(res) => panic!(
                                    "a send answered {}: {}",
                                    res.status(),
                                    res.text().await.unwrap_or_default()
                                ),
                                Err(_) => {}
                            }
                            failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        };
                        acked.lock().unwrap().push(((c, seq), body, Instant::now()));
                        tokio::time::sleep(every).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            acked,
            failed,
            tasks,
        }
    }

    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// `(conversation, seq)` was acknowledged after `t`.
    pub fn acked_since(&self, t: Instant, conversation: i64, seq: i64) -> bool {
        self.acked
            .lock()
            .unwrap()
            .iter()
            .any(|(k, _, at)| *k == (conversation, seq) && *at > t)
    }

    /// The highest seq acknowledged in `conversation` so far.
    pub fn last_acked(&self, conversation: i64) -> Option<i64> {
        self.acked
            .lock()
            .unwrap()
            .iter()
            .filter(|((c, _), _, _)| *c == conversation)
            .map(|((_, s), _, _)| *s)
            .max()
    }

    /// Waits until `n` sends are acknowledged; fails the test at the deadline.
    pub async fn until_acked(&self, n: usize, deadline: Duration) {
        let until = Instant::now() + deadline;
        while self.acked_count() < n {
            assert!(
                Instant::now() < until,
                "{} of {n} sends acknowledged within {deadline:?} ({} attempts failed)",
                self.acked_count(),
                self.failed.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every sender after its send in flight is answered.
    pub async fn stop(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a sender ends");
        }
        let acked = self.acked.lock().unwrap();
        Report {
            acked: acked.iter().map(|(k, b, _)| (*k, b.clone())).collect(),
            failed_attempts: self.failed.load(Ordering::Relaxed),
        }
    }
}
