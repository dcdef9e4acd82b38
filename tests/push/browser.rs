//! The browser client (ingest-api's `/app`, demo mode) in two real headless Chromium
//! browsers, driven by Selenium (tests/browser/two_browsers.py): two people chat, each
//! sees the other's message within a second, and unread counts fall as they read; a
//! reaction reaches the other's message, and a mention made with the @ picker badges
//! the other's inbox until they read it.
//! Debian's chromium and chromium-driver; never a downloaded browser.

use std::time::Duration;

use chatpipe_tests::stream::spawn_pipeline_adjusted;
use ingest_api::configuration::ReadMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_people_chat_in_two_browsers_through_the_demo_client() {
    let python = std::env::var("CHATPIPE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "CHATPIPE_PYTHON is not set: run the suite with scripts/test, which installs selenium"
        )
    });
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing: apt-get install chromium chromium-driver (scripts/test does)"
        );
    }
    // The gateway's port is chosen first: the app tells the browser where it is.
    let gateway_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let p = spawn_pipeline_adjusted(ReadMode::Stream, |s| {
        s.demo.enabled = true;
        s.demo.gateway_url = format!("ws://127.0.0.1:{gateway_port}/ws");
    })
    .await;
    let _receipts = p.start_receipts(p.receipts_settings());
    let _fanout = p.start_fanout(p.fanout_settings());
    let mut settings = p.gateway_settings("browser", 0);
    // The app signs in with demo tokens.
    settings.auth.accept_demo_tokens = true;
    settings.http.addr = format!("127.0.0.1:{gateway_port}").parse().unwrap();
    let _gw = p.start_gateway(settings).await;

    let alice = 7_000_000 + (rand::random::<u32>() % 1_000_000) as i64;
    let bob = alice + 1_000_000;
    let shot = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/browser/two-browsers.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/two_browsers.py");
    let run = tokio::process::Command::new(&python)
        .args([
            script,
            "--api",
            &p.app.base,
            "--alice",
            &alice.to_string(),
            "--bob",
            &bob.to_string(),
            "--screenshot",
            shot.to_str().unwrap(),
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the browsers finished within 180 s")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap()).expect("a JSON line of results");
    eprintln!("browsers: {result}");
    for check in [
        "aliceSawReaction",
        "aliceSawMention",
        "aliceMentionClearedByReading",
        "aliceSawUnreadThread",
        "aliceSawThreadReply",
        "aliceThreadClearedByReading",
    ] {
        assert_eq!(result["checks"][check], true, "{check}: {result}");
    }
    p.cleanup().await;
}
