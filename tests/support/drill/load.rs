//! The drill's load: senders through both ingest-apis (a retried send keeps its
//! clientMsgId and goes to the other API, as a client would), readers, and one
//! WebSocket client per user spread over both gateways. A client that loses its socket
//! reconnects (its gateway, then the other) and catches up over REST.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use futures::StreamExt;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::services::{gateway_url, ingest_url};

/// A send the API acknowledged (201, or 200 for a replay).
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    pub conversation: i64,
    pub seq: i64,
    pub client_msg_id: uuid::Uuid,
    /// When the API answered.
    pub at: Instant,
}

/// The drill's users and conversations, fixed at the start.
pub struct World {
    /// conversation -> members.
    pub conversations: BTreeMap<i64, Vec<i64>>,
    /// user -> conversations.
    pub memberships: BTreeMap<i64, Vec<i64>>,
    pub keys: TokenKeys,
    pub http: reqwest::Client,
}

impl World {
    pub fn token(&self, user: i64) -> String {
        self.keys
            .issue(UserId::new(user).unwrap(), Duration::from_secs(24 * 3600))
    }

    /// `conversations` groups over `users` users (ids from `first_user`), each user in
    /// one group, created through the first ingest-api.
    pub async fn create(
        keys: TokenKeys,
        first_user: i64,
        users: usize,
        conversations: usize,
    ) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut world = World {
            conversations: BTreeMap::new(),
            memberships: BTreeMap::new(),
            keys,
            http,
        };
        let ids: Vec<i64> = (0..users as i64).map(|i| first_user + i).collect();
        for group in ids.chunks(users.div_ceil(conversations)) {
            let (creator, others) = group.split_first().unwrap();
            let res = world
                .http
                .post(format!("{}/v1/conversations", ingest_url(0)))
                .bearer_auth(world.token(*creator))
                .json(&json!({"type": "GROUP", "title": "drill", "memberIds": others}))
                .send()
                .await
                .expect("creating a drill conversation");
            assert_eq!(res.status(), 201, "creating a drill conversation");
            let body: Value = res.json().await.unwrap();
            let id = body["conversationId"].as_i64().unwrap();
            world.conversations.insert(id, group.to_vec());
            for u in group {
                world.memberships.entry(*u).or_default().push(id);
            }
        }
        world
    }

    pub fn users(&self) -> Vec<i64> {
        self.memberships.keys().copied().collect()
    }

    pub fn is_member(&self, user: i64, conversation: i64) -> bool {
        self.memberships
            .get(&user)
            .is_some_and(|c| c.contains(&conversation))
    }
}

/// Everything the senders were told, in order.
#[derive(Default)]
pub struct Acks {
    pub all: Mutex<Vec<Ack>>,
    /// Sends given up on (no answer within a minute of retries): not acknowledged; lost
    /// only if PostgreSQL committed one and it never reached chat.events.
    pub abandoned: AtomicU64,
    /// Their (conversation, clientMsgId): the audit asks PostgreSQL whether they committed.
    pub abandoned_ids: Mutex<Vec<(i64, uuid::Uuid)>>,
    /// Retries of a send (network error or 5xx), all with the same clientMsgId.
    pub retries: AtomicU64,
}

/// Sends `rate` messages a second in all, from random members of random conversations,
/// alternating the two ingest-apis, until `stop`.
pub async fn send(world: Arc<World>, acks: Arc<Acks>, rate: u32, stop: Arc<AtomicBool>) {
    let tasks = 16u32.min(rate.max(1));
    let every = Duration::from_secs_f64(tasks as f64 / rate.max(1) as f64);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (world, acks, stop) = (world.clone(), acks.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let conversations: Vec<i64> = world.conversations.keys().copied().collect();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = t as usize;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let (conversation, sender) = {
                    let mut rng = rand::rng();
                    let c = *conversations.choose(&mut rng).unwrap();
                    (c, *world.conversations[&c].choose(&mut rng).unwrap())
                };
                n += 1;
                if let Some(ack) = send_one(&world, &acks, conversation, sender, n).await {
                    acks.all.lock().unwrap().push(ack);
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
}

/// One send, retried with the same clientMsgId on the other API until it is answered.
async fn send_one(
    world: &World,
    acks: &Acks,
    conversation: i64,
    sender: i64,
    n: usize,
) -> Option<Ack> {
    let client_msg_id = uuid::Uuid::new_v4();
    let body = json!({"clientMsgId": client_msg_id, "body": format!("drill {n}")});
    let token = world.token(sender);
    let give_up = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0usize;
    loop {
        let api = ingest_url((n + attempt) % 2);
        let res = world
            .http
            .post(format!("{api}/v1/conversations/{conversation}/messages"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await;
        match res {
            Ok(r) if r.status() == 201 || r.status() == 200 => {
                let v: Value = r.json().await.ok()?;
                return Some(Ack {
                    conversation,
                    seq: v["seq"].as_i64()?,
                    client_msg_id,
                    at: Instant::now(),
                });
            }
            Ok(r) if r.status().is_client_error() => {
                panic!(
                    "drill send refused: {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                )
            }
            _ => {}
        }
        if Instant::now() > give_up {
            acks.abandoned.fetch_add(1, Ordering::Relaxed);
            acks.abandoned_ids
                .lock()
                .unwrap()
                .push((conversation, client_msg_id));
            return None;
        }
        acks.retries.fetch_add(1, Ordering::Relaxed);
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(200 * attempt.min(10) as u64)).await;
    }
}

/// What one user's client saw.
#[derive(Default)]
pub struct Seen {
    /// conversation -> seqs received (pushed or fetched).
    pub seqs: BTreeMap<i64, BTreeSet<i64>>,
    /// (conversation, seq) pushed more than once.
    pub pushed_twice: u64,
    pub pushed: u64,
    pub fetched: u64,
    /// message.new frames of conversations the user is not in.
    pub non_member_frames: u64,
    pub reconnects: u64,
    /// (conversation, seq) -> the gateway (0 or 1) that pushed it first, and when.
    pub pushed_by: std::collections::HashMap<(i64, i64), (usize, Instant)>,
    /// The client's sockets: (gateway, open from, closed at; None while open).
    pub sockets: Vec<(usize, Instant, Option<Instant>)>,
}

impl Seen {
    /// The gateway the client's socket was open on at `t`.
    pub fn gateway_at(&self, t: Instant) -> Option<usize> {
        self.sockets
            .iter()
            .rev()
            .find(|(_, from, until)| *from <= t && until.is_none_or(|u| t < u))
            .map(|(g, _, _)| *g)
    }
}

/// The clients' shared record.
pub struct Clients {
    pub seen: BTreeMap<i64, Mutex<Seen>>,
    /// When any client last received a frame (for recovery times).
    pub frames: Mutex<Vec<Instant>>,
    pub connected: AtomicU64,
}

impl Clients {
    pub fn new(users: &[i64]) -> Self {
        Self {
            seen: users
                .iter()
                .map(|u| (*u, Mutex::new(Seen::default())))
                .collect(),
            frames: Mutex::new(Vec::new()),
            connected: AtomicU64::new(0),
        }
    }

    /// The first frame any client received after `t`.
    pub fn first_frame_after(&self, t: Instant) -> Option<Instant> {
        self.frames
            .lock()
            .unwrap()
            .iter()
            .filter(|f| **f > t)
            .min()
            .copied()
    }
}

/// One WebSocket per user (user on gateway `user % 2` first), kept connected until `stop`.
pub fn connect_all(
    world: Arc<World>,
    clients: Arc<Clients>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    world
        .users()
        .into_iter()
        .map(|user| {
            let (world, clients, stop) = (world.clone(), clients.clone(), stop.clone());
            tokio::spawn(async move { client(world, clients, user, stop).await })
        })
        .collect()
}

async fn client(world: Arc<World>, clients: Arc<Clients>, user: i64, stop: Arc<AtomicBool>) {
    let token = world.token(user);
    let home = (user % 2) as usize;
    let mut attempt = 0usize;
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        let gateway = (home + attempt) % 2;
        let url = gateway_url(gateway);
        let ws = match gateway::client::connect(&url, &token).await {
            Ok(ws) => ws,
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200 * attempt.min(10) as u64)).await;
                continue;
            }
        };
        attempt = 0;
        clients.connected.fetch_add(1, Ordering::Relaxed);
        clients.seen[&user]
            .lock()
            .unwrap()
            .sockets
            .push((gateway, Instant::now(), None));
        if !first {
            clients.seen[&user].lock().unwrap().reconnects += 1;
            // What was pushed while the socket was down: over REST.
            catch_up(&world, &clients, user).await;
        }
        first = false;
        let (_, mut read) = ws.split();
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), read.next()).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let frame = match next {
                Err(_) => continue,
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(_))) | Ok(None) => break,
            };
            let Ok(v) = serde_json::from_str::<Value>(&frame) else {
                continue;
            };
            if v["type"] != "message.new" {
                continue;
            }
            clients.frames.lock().unwrap().push(Instant::now());
            let (Some(c), Some(seq)) = (v["conversationId"].as_i64(), v["seq"].as_i64()) else {
                continue;
            };
            let mut seen = clients.seen[&user].lock().unwrap();
            if !world.is_member(user, c) {
                seen.non_member_frames += 1;
                continue;
            }
            seen.pushed += 1;
            seen.pushed_by
                .entry((c, seq))
                .or_insert((gateway, Instant::now()));
            if !seen.seqs.entry(c).or_default().insert(seq) {
                seen.pushed_twice += 1;
            }
        }
        clients.connected.fetch_sub(1, Ordering::Relaxed);
        if let Some(socket) = clients.seen[&user].lock().unwrap().sockets.last_mut() {
            socket.2 = Some(Instant::now());
        }
    }
}

/// Fetches over REST every message of the user's conversations after the highest seq
/// it holds without a hole.
pub async fn catch_up(world: &World, clients: &Clients, user: i64) {
    let token = world.token(user);
    for conversation in world.memberships[&user].clone() {
        let mut after = {
            let seen = clients.seen[&user].lock().unwrap();
            contiguous(seen.seqs.get(&conversation))
        };
        for api in (0..).map(|i| ingest_url(i % 2)).take(40) {
            let res = world
                .http
                .get(format!(
                    "{api}/v1/conversations/{conversation}/messages?afterSeq={after}&limit=200"
                ))
                .bearer_auth(&token)
                .send()
                .await;
            let Ok(r) = res else {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            };
            if !r.status().is_success() {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            let page: Value = r.json().await.unwrap_or(Value::Null);
            let seqs: Vec<i64> = page["messages"]
                .as_array()
                .map(|m| m.iter().filter_map(|m| m["seq"].as_i64()).collect())
                .unwrap_or_default();
            {
                let mut seen = clients.seen[&user].lock().unwrap();
                seen.fetched += seqs.len() as u64;
                seen.seqs.entry(conversation).or_default().extend(&seqs);
            }
            match seqs.last() {
                Some(last) if page["hasMore"] == true => after = *last,
                _ => break,
            }
        }
    }
}

/// The highest seq with every seq below it present (0 for none).
fn contiguous(seqs: Option<&BTreeSet<i64>>) -> i64 {
    let mut n = 0;
    if let Some(seqs) = seqs {
        for s in seqs {
            if *s == n + 1 {
                n = *s;
            } else if *s > n + 1 {
                break;
            }
        }
    }
    n
}

/// Members mark what their client holds as read, a few a second, through either API.
pub async fn read(world: Arc<World>, clients: Arc<Clients>, rate: u32, stop: Arc<AtomicBool>) {
    let users = world.users();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let user = *users.choose(&mut rand::rng()).unwrap();
        let reads: Vec<(i64, i64)> = {
            let seen = clients.seen[&user].lock().unwrap();
            seen.seqs
                .iter()
                .filter_map(|(c, s)| s.last().map(|last| (*c, *last)))
                .collect()
        };
        for (conversation, seq) in reads {
            let api = ingest_url(n % 2);
            let _ = world
                .http
                .post(format!("{api}/v1/conversations/{conversation}/read"))
                .bearer_auth(world.token(user))
                .json(&json!({"seq": seq - rand::rng().random_range(0..2).min(seq - 1)}))
                .send()
                .await;
        }
    }
}
