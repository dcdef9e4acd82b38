//! Migrations applied to a database that already holds data: what each changes in rows
//! that were written before it.

use sqlx::{Connection, PgConnection};

/// A migrator of the repository's migrations up to and including `last` (a version).
async fn migrations_up_to(last: i64) -> sqlx::migrate::Migrator {
    let dir = std::env::temp_dir().join(format!("migrations-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    for entry in std::fs::read_dir(source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let version: i64 = name.split('_').next().unwrap().parse().unwrap();
        if version <= last {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    migrator
}

#[tokio::test]
async fn groups_made_before_roles_get_an_admin_each_the_creator_or_their_longest_standing_member() {
    let url = chatpipe_tests::fresh_database().await;
    let mut db = PgConnection::connect(&url).await.unwrap();
    migrations_up_to(20261201000004)
        .await
        .run(&mut db)
        .await
        .unwrap();
    // Group 1 still has its creator (10); group 2's creator left, 30 joined before 20;
    // a DIRECT conversation gets no admin.
    sqlx::raw_sql(
        "INSERT INTO conversation (id, type, title, created_by, member_count) OVERRIDING SYSTEM VALUE
              VALUES (1, 'GROUP', 'kept', 10, 2), (2, 'GROUP', 'left', 10, 2), (3, 'DIRECT', NULL, 10, 2);
         INSERT INTO conversation_member (conversation_id, user_id, joined_at) VALUES
              (1, 10, '2026-01-01'), (1, 20, '2026-01-02'),
              (2, 20, '2026-01-03'), (2, 30, '2026-01-02'),
              (3, 10, '2026-01-01'), (3, 20, '2026-01-01');",
    )
    .execute(&mut db)
    .await
    .unwrap();
    ingest_api::startup::MIGRATOR.run(&mut db).await.unwrap();
    let admins: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT conversation_id, user_id FROM conversation_member WHERE role = 'ADMIN'
          ORDER BY conversation_id",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert_eq!(admins, vec![(1, 10), (2, 30)]);
}
