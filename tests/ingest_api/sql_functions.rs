//! `sql/functions/`: the current definition of every SQL function of ours, one file each,
//! as PostgreSQL prints it (`pg_get_functiondef`) after all migrations ran. Migrations
//! keep their history (a function redefined later still reads as it was then); these
//! files are where a reader finds what runs today. This test fails when a file and the
//! migrated database differ, or a file names a function that no longer exists; after a
//! migration that changes a function, rewrite the files with
//! `CHATPIPE_BLESS_SQL=1 scripts/test sql_functions` (or `cargo test --test ingest_api
//! sql_functions` with the stack's environment) and review the diff.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chatpipe_tests::spawn_app;

fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sql/functions")
}

/// Every function of the migrated schema that no extension owns: name -> its
/// definitions (overloads in the order of their arguments), each ending with `;`.
async fn migrated_definitions(pool: &sqlx::PgPool) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, pg_get_functiondef(p.oid)
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p')
            AND NOT EXISTS (SELECT 1 FROM pg_depend d
                             WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                               AND d.deptype = 'e')
          ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for (name, def) in rows {
        let file = files.entry(name).or_default();
        if !file.is_empty() {
            file.push('\n');
        }
        file.push_str(def.trim_end());
        file.push_str(";\n");
    }
    files
}

fn files_on_disk() -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(folder()).expect("sql/functions/ exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sql") {
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    files
}

#[tokio::test]
async fn every_sql_function_has_its_current_definition_in_sql_functions() {
    let app = spawn_app().await;
    let migrated = migrated_definitions(&app.pool).await;
    assert!(
        migrated.contains_key("chat_send_many"),
        "the migrated schema has the send function: {:?}",
        migrated.keys()
    );
    if std::env::var_os("CHATPIPE_BLESS_SQL").is_some() {
        for (name, _) in files_on_disk() {
            if !migrated.contains_key(&name) {
                std::fs::remove_file(folder().join(format!("{name}.sql"))).unwrap();
            }
        }
        for (name, def) in &migrated {
            std::fs::write(folder().join(format!("{name}.sql")), def).unwrap();
        }
        return;
    }
    let on_disk = files_on_disk();
    let stale: Vec<&String> = on_disk
        .keys()
        .filter(|n| !migrated.contains_key(*n))
        .collect();
    let missing: Vec<&String> = migrated
        .keys()
        .filter(|n| !on_disk.contains_key(*n))
        .collect();
    let changed: Vec<&String> = migrated
        .iter()
        .filter(|(n, def)| on_disk.get(*n).is_some_and(|f| f != *def))
        .map(|(n, _)| n)
        .collect();
    assert!(
        stale.is_empty() && missing.is_empty() && changed.is_empty(),
        "sql/functions/ differs from the migrated database: files of functions that do not \
         exist {stale:?}, functions without a file {missing:?}, files that differ {changed:?}; \
         rewrite them with CHATPIPE_BLESS_SQL=1 (see tests/ingest_api/sql_functions.rs)"
    );
}
