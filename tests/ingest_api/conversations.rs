use chatpipe_tests::{spawn_app, spawn_app_with, TestApp};
use futures::future::join_all;
use ingest_api::configuration::Bucket;
use serde_json::json;

/// An app where one owner may fill several groups at once: these tests are about the
/// member cap, not `rate_limits.members_added` (tests/ingest_api/consent.rs).
async fn app_without_an_adding_bound() -> TestApp {
    spawn_app_with(|s| s.rate_limits.members_added = Bucket::OFF).await
}

#[tokio::test]
async fn a_group_is_created_with_its_creator_as_a_member() {
    let app = spawn_app().await;
    let body = app
        .user(10)
        .post(
            "/v1/conversations",
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
    let app = app_without_an_adding_bound().await;
    let owner = app.user(1);
    let full: Vec<i64> = (2..=1000).collect();
    let too_many: Vec<i64> = (2..=1001).collect();

    let problem = owner
        .post(
            "/v1/conversations",
            json!({"type": "GROUP", "memberIds": too_many}),
        )
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/member-limit");
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 0);

    let conv = owner.create_group(&full).await;
    let problem = owner
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [1001]}),
        )
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/member-limit");
    // All or nothing: a batch that would cross the cap adds nobody.
    let conv2 = owner.create_group(&(2..=998).collect::<Vec<_>>()).await;
    owner
        .post(
            &format!("/v1/conversations/{conv2}/members"),
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
    let app = app_without_an_adding_bound().await;
    let owner = app.user(1);
    let conv = owner.create_group(&(2..=990).collect::<Vec<_>>()).await;
    let path = format!("/v1/conversations/{conv}/members");
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
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [30, 20]}),
        )
        .await
        .expect(200);
    assert_eq!(added["added"], json!([30]), "20 was a member already");
    assert_eq!(added["memberCount"], 3);
    assert_eq!(added["lastReadSeq"], 7);

    let inbox = app.user(30).get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["lastReadSeq"], 7);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 0);
    owner.send_message(conv, "welcome").await;
    let inbox = app.user(30).get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 1);
}

#[tokio::test]
async fn members_leave_and_only_an_admin_removes_others() {
    let app = spawn_app().await;
    let owner = app.user(10);
    let conv = owner.create_group(&[20, 30]).await;

    app.user(20)
        .delete(&format!("/v1/conversations/{conv}/members/30"))
        .await
        .problem(403);
    app.user(20)
        .delete(&format!("/v1/conversations/{conv}/members/20"))
        .await
        .expect(204);
    owner
        .delete(&format!("/v1/conversations/{conv}/members/30"))
        .await
        .expect(204);
    owner
        .delete(&format!("/v1/conversations/{conv}/members/30"))
        .await
        .problem(404);

    // A former member is a stranger now.
    app.user(20)
        .get(&format!("/v1/conversations/{conv}/messages"))
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

/// The roles of the members as `GET …/members` lists them: (userId, role) in join order.
async fn roles(app: &chatpipe_tests::TestApp, asker: i64, conv: i64) -> Vec<(i64, String)> {
    let body = app
        .user(asker)
        .get(&format!("/v1/conversations/{conv}/members"))
        .await
        .expect(200);
    body["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["userId"].as_i64().unwrap(),
                m["role"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn role_events(events: &[chatpipe_schemas::ChatEvent]) -> Vec<(i64, &'static str, i64)> {
    events
        .iter()
        .filter_map(|e| match e {
            chatpipe_schemas::ChatEvent::MemberRoleChanged(r) => {
                Some((r.user_id.get(), r.role.as_str(), r.changed_by.get()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn only_admins_add_and_remove_others_and_change_roles() {
    let app = spawn_app().await;
    let (creator, bob, carol, dave) = (10, 20, 30, 40);
    let conv = app.user(creator).create_group(&[bob, carol]).await;
    let admin = |u: i64| (u, "ADMIN".to_owned());
    let member = |u: i64| (u, "MEMBER".to_owned());
    assert_eq!(
        roles(&app, bob, conv).await,
        vec![admin(creator), member(bob), member(carol)],
        "the creator is admin"
    );
    let members = format!("/v1/conversations/{conv}/members");

    // A member adds nobody, removes nobody else, promotes nobody: 403, nothing written.
    let outbox_before = app.count("SELECT count(*) FROM outbox").await;
    for res in [
        app.user(bob)
            .post(&members, json!({"userIds": [dave]}))
            .await,
        app.user(bob).delete(&format!("{members}/{carol}")).await,
        app.user(bob)
            .patch(&format!("{members}/{bob}"), json!({"role": "ADMIN"}))
            .await,
    ] {
        let problem = res.problem(403);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .starts_with("only the group's admins may"),
            "{problem}"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM outbox").await,
        outbox_before
    );

    // The admin kicks carol; a member cannot bring her back, the admin can.
    app.user(creator)
        .delete(&format!("{members}/{carol}"))
        .await
        .expect(204);
    app.user(bob)
        .post(&members, json!({"userIds": [carol]}))
        .await
        .problem(403);
    app.user(creator)
        .post(&members, json!({"userIds": [carol]}))
        .await
        .expect(200);

    // The admin promotes bob, who may now remove and add; a role set twice changes nothing.
    let set = app
        .user(creator)
        .patch(&format!("{members}/{bob}"), json!({"role": "ADMIN"}))
        .await
        .expect(200);
    assert_eq!(set["role"], "ADMIN");
    app.user(creator)
        .patch(&format!("{members}/{bob}"), json!({"role": "ADMIN"}))
        .await
        .expect(200);
    app.user(bob)
        .post(&members, json!({"userIds": [dave]}))
        .await
        .expect(200);
    app.user(bob)
        .delete(&format!("{members}/{dave}"))
        .await
        .expect(204);
    // Bad roles and strangers.
    let problem = app
        .user(creator)
        .patch(&format!("{members}/{bob}"), json!({"role": "OWNER"}))
        .await
        .problem(422);
    assert_eq!(problem["field"], "role");
    app.user(creator)
        .patch(&format!("{members}/{dave}"), json!({"role": "ADMIN"}))
        .await
        .problem(404);
    app.user(dave).get(&members).await.problem(404);

    // Two admins: either may step down, but not the last one.
    app.user(bob)
        .patch(&format!("{members}/{creator}"), json!({"role": "MEMBER"}))
        .await
        .expect(200);
    let problem = app
        .user(bob)
        .patch(&format!("{members}/{bob}"), json!({"role": "MEMBER"}))
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/last-admin");
    assert_eq!(
        roles(&app, creator, conv).await,
        vec![member(creator), admin(bob), member(carol)]
    );
    assert_eq!(
        role_events(&app.outbox_events().await),
        vec![(bob, "ADMIN", creator), (creator, "MEMBER", bob)],
        "one event per change, none for a role set twice or refused"
    );
}

#[tokio::test]
async fn when_the_last_admin_leaves_the_longest_standing_member_becomes_admin() {
    let app = spawn_app().await;
    let (creator, bob, carol, dave) = (10, 20, 30, 40);
    let conv = app.user(creator).create_group(&[carol]).await;
    let members = format!("/v1/conversations/{conv}/members");
    app.user(creator)
        .post(&members, json!({"userIds": [bob]}))
        .await
        .expect(200);
    app.user(creator)
        .post(&members, json!({"userIds": [dave]}))
        .await
        .expect(200);
    // carol joined with the creator, bob and dave later: carol has stood longest.
    app.user(creator)
        .delete(&format!("{members}/{creator}"))
        .await
        .expect(204);
    let now = roles(&app, bob, conv).await;
    assert_eq!(now[0], (carol, "ADMIN".to_owned()), "{now:?}");
    assert_eq!(
        now.iter().filter(|(_, r)| r == "ADMIN").count(),
        1,
        "{now:?}"
    );
    assert_eq!(
        role_events(&app.outbox_events().await),
        vec![(carol, "ADMIN", creator)]
    );
    // The new admin can remove; a plain member's leaving hands nothing on.
    app.user(carol)
        .delete(&format!("{members}/{dave}"))
        .await
        .expect(204);
    app.user(bob)
        .delete(&format!("{members}/{bob}"))
        .await
        .expect(204);
    assert_eq!(
        roles(&app, carol, conv).await,
        vec![(carol, "ADMIN".to_owned())]
    );
    // The last member leaving leaves nobody to promote.
    app.user(carol)
        .delete(&format!("{members}/{carol}"))
        .await
        .expect(204);
    assert_eq!(role_events(&app.outbox_events().await).len(), 1);
}

#[tokio::test]
async fn direct_conversations_are_one_per_pair() {
    let app = spawn_app().await;
    let first = app
        .user(10)
        .post("/v1/direct", json!({"peerId": 20}))
        .await
        .expect(201);
    assert_eq!(first["type"], "DIRECT");
    assert_eq!(first["peerId"], 20);
    let again = app
        .user(20)
        .post("/v1/direct", json!({"peerId": 10}))
        .await
        .expect(200);
    assert_eq!(again["conversationId"], first["conversationId"]);
    assert_eq!(again["peerId"], 10);

    let conv = first["conversationId"].as_i64().unwrap();
    app.user(10)
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [30]}),
        )
        .await
        .problem(409);
    app.user(10)
        .delete(&format!("/v1/conversations/{conv}/members/20"))
        .await
        .problem(409);
    app.user(10)
        .post("/v1/direct", json!({"peerId": 10}))
        .await
        .problem(422);
}

#[tokio::test]
async fn concurrent_direct_opens_for_one_pair_yield_one_conversation() {
    let app = spawn_app().await;
    let calls = (0..24).map(|i| {
        let (me, peer) = if i % 2 == 0 { (10, 20) } else { (20, 10) };
        let client = app.user(me);
        async move { client.post("/v1/direct", json!({"peerId": peer})).await }
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
