use chatpipe_tests::spawn_app;
use futures::future::join_all;
use serde_json::json;

#[tokio::test]
async fn a_group_is_created_with_its_creator_as_a_member() {
    let app = spawn_app().await;
    let body = app
        .user(10)
        .post(
            "/conversations",
            json!({"type": "GROUP", "title": " Team ", "memberIds": [20, 30, 20]}),
        )
        .await
        .expect(201);
    assert_eq!(body["type"], "GROUP");
    assert_eq!(body["title"], "Team");
    assert_eq!(body["createdBy"], 10);
    assert_eq!(body["memberCount"], 3);
    assert_eq!(body["lastSeq"], 0);
    let members: Vec<i64> =
        sqlx::query_scalar("SELECT user_id FROM conversation_member ORDER BY user_id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(members, vec![10, 20, 30]);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'member.joined'")
            .await,
        3
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'conversation.created'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_group_holds_at_most_a_thousand_members() {
    let app = spawn_app().await;
    let owner = app.user(1);
    let full: Vec<i64> = (2..=1000).collect();
    let too_many: Vec<i64> = (2..=1001).collect();

    let problem = owner
        .post(
            "/conversations",
            json!({"type": "GROUP", "memberIds": too_many}),
        )
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/member-limit");
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 0);

    let conv = owner.create_group(&full).await;
    let problem = owner
        .post(
            &format!("/conversations/{conv}/members"),
            json!({"userIds": [1001]}),
        )
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/member-limit");
    // All or nothing: a batch that would cross the cap adds nobody.
    let conv2 = owner.create_group(&(2..=998).collect::<Vec<_>>()).await;
    owner
        .post(
            &format!("/conversations/{conv2}/members"),
            json!({"userIds": [2000, 2001, 2002]}),
        )
        .await
        .problem(409);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM conversation_member WHERE conversation_id = {conv2}"
        ))
        .await,
        998
    );
    assert_eq!(
        app.count(&format!(
            "SELECT member_count::bigint FROM conversation WHERE id = {conv2}"
        ))
        .await,
        998
    );
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM conversation_member WHERE conversation_id = {conv}"
        ))
        .await,
        1000
    );
}

#[tokio::test]
async fn concurrent_additions_never_pass_the_cap() {
    let app = spawn_app().await;
    let owner = app.user(1);
    let conv = owner.create_group(&(2..=990).collect::<Vec<_>>()).await;
    let path = format!("/conversations/{conv}/members");
    // 20 callers add 1 new user each; only 10 seats are left.
    let responses =
        join_all((0..20).map(|i| owner.post(&path, json!({"userIds": [5000 + i]})))).await;
    let ok = responses.iter().filter(|r| r.status == 200).count();
    let refused = responses.iter().filter(|r| r.status == 409).count();
    assert_eq!((ok, refused), (10, 10));
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM conversation_member WHERE conversation_id = {conv}"
        ))
        .await,
        1000
    );
    assert_eq!(
        app.count(&format!(
            "SELECT member_count::bigint FROM conversation WHERE id = {conv}"
        ))
        .await,
        1000
    );
}

#[tokio::test]
async fn a_new_member_starts_with_nothing_unread() {
    let app = spawn_app().await;
    let owner = app.user(10);
    let conv = owner.create_group(&[20]).await;
    for i in 0..7 {
        owner
            .send_message(conv, &format!("before you came {i}"))
            .await;
    }
    let added = owner
        .post(
            &format!("/conversations/{conv}/members"),
            json!({"userIds": [30, 20]}),
        )
        .await
        .expect(200);
    assert_eq!(added["added"], json!([30]), "20 was a member already");
    assert_eq!(added["memberCount"], 3);
    assert_eq!(added["lastReadSeq"], 7);

    let inbox = app.user(30).get("/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["lastReadSeq"], 7);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 0);
    owner.send_message(conv, "welcome").await;
    let inbox = app.user(30).get("/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 1);
}

#[tokio::test]
async fn members_leave_and_only_the_creator_removes_others() {
    let app = spawn_app().await;
    let owner = app.user(10);
    let conv = owner.create_group(&[20, 30]).await;

    app.user(20)
        .delete(&format!("/conversations/{conv}/members/30"))
        .await
        .problem(403);
    app.user(20)
        .delete(&format!("/conversations/{conv}/members/20"))
        .await
        .expect(204);
    owner
        .delete(&format!("/conversations/{conv}/members/30"))
        .await
        .expect(204);
    owner
        .delete(&format!("/conversations/{conv}/members/30"))
        .await
        .problem(404);

    // A former member is a stranger now.
    app.user(20)
        .get(&format!("/conversations/{conv}/messages"))
        .await
        .problem(404);
    assert_eq!(
        app.count(&format!(
            "SELECT member_count::bigint FROM conversation WHERE id = {conv}"
        ))
        .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'member.left'")
            .await,
        2
    );
}

#[tokio::test]
async fn direct_conversations_are_one_per_pair() {
    let app = spawn_app().await;
    let first = app
        .user(10)
        .post("/direct", json!({"peerId": 20}))
        .await
        .expect(201);
    assert_eq!(first["type"], "DIRECT");
    assert_eq!(first["peerId"], 20);
    let again = app
        .user(20)
        .post("/direct", json!({"peerId": 10}))
        .await
        .expect(200);
    assert_eq!(again["conversationId"], first["conversationId"]);
    assert_eq!(again["peerId"], 10);

    let conv = first["conversationId"].as_i64().unwrap();
    app.user(10)
        .post(
            &format!("/conversations/{conv}/members"),
            json!({"userIds": [30]}),
        )
        .await
        .problem(409);
    app.user(10)
        .delete(&format!("/conversations/{conv}/members/20"))
        .await
        .problem(409);
    app.user(10)
        .post("/direct", json!({"peerId": 10}))
        .await
        .problem(422);
}

#[tokio::test]
async fn concurrent_direct_opens_for_one_pair_yield_one_conversation() {
    let app = spawn_app().await;
    let calls = (0..24).map(|i| {
        let (me, peer) = if i % 2 == 0 { (10, 20) } else { (20, 10) };
        let client = app.user(me);
        async move { client.post("/direct", json!({"peerId": peer})).await }
    });
    let responses = join_all(calls).await;

    let created = responses.iter().filter(|r| r.status == 201).count();
    assert_eq!(created, 1, "exactly one call creates it");
    assert!(responses.iter().all(|r| r.status == 201 || r.status == 200));
    let ids: std::collections::BTreeSet<_> = responses
        .iter()
        .map(|r| r.body["conversationId"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM conversation_member").await,
        2
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'conversation.created'")
            .await,
        1
    );
}
