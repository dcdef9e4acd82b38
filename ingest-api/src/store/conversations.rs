//! Creating conversations and changing who is in them.
//!
//! Group roles: the creator joins as admin. Only admins add members, remove other
//! members and change roles; anyone may leave. When the last admin leaves, the member
//! who joined first (then the lowest user id) becomes admin, in the same transaction, so
//! a group with members always has an admin. DIRECT conversations have no admin.
//!
//! Leaving a DIRECT conversation is for good, as leaving a group is: the leaver's
//! membership goes (their inbox and their other devices' sync drop it), the peer keeps
//! the conversation and may still write into it, and nothing the peer does brings the
//! leaver back. Only the leaver can: `POST /direct` with the peer rejoins them, at the
//! conversation's last seq (what the peer wrote meanwhile is in history, not unread).
//! With a block either way nobody writes in it ([`super::blocks`]).

use chatpipe_core::{db, ConversationId, UserId, Watermark};
use chatpipe_schemas::{
    ChatEvent, ConversationCreated, MemberJoined, MemberLeft, MemberRoleChanged, Role,
};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::idempotency::{self, Keyed, Outcome};
use super::{blocks, now, Store, StoreError};
use crate::domain::ConversationKind;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ConversationView {
    #[sqlx(rename = "id")]
    pub conversation_id: i64,
    #[serde(rename = "type")]
    #[sqlx(rename = "type")]
    pub kind: ConversationKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub created_by: i64,
    pub created_at: DateTime<Utc>,
    pub last_seq: i64,
    pub member_count: i32,
    /// The other member of a DIRECT conversation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_id: Option<i64>,
}

const VIEW_COLUMNS: &str =
    "c.id, c.type, c.title, c.created_by, c.created_at, c.last_seq, c.member_count";

/// A new GROUP with the creator and `member_ids` (already validated and deduplicated).
pub async fn create_group(
    db: &Store,
    creator: UserId,
    title: Option<String>,
    mut member_ids: Vec<i64>,
    max_members: usize,
    key: Option<&Keyed>,
) -> Result<Outcome<ConversationView>, StoreError> {
    if !member_ids.contains(&creator.get()) {
        member_ids.push(creator.get());
    }
    if member_ids.len() > max_members {
        return Err(member_limit(member_ids.len(), max_members));
    }
    let at = now();
    let mut tx = db.pool.begin().await?;
    if let Some(key) = key {
        if let Some(first) = idempotency::claim(&mut tx, key).await? {
            return Ok(Outcome::Replayed(first));
        }
    }
    blocks::refuse_adding(&mut tx, creator, &member_ids).await?;
    let view: ConversationView = sqlx::query_as(&format!(
        "INSERT INTO conversation AS c (type, title, created_by, created_at, last_activity_at, member_count)
         VALUES ('GROUP', $1, $2, $3, $3, $4)
         RETURNING {VIEW_COLUMNS}, NULL::bigint AS peer_id"
    ))
    .bind(&title)
    .bind(creator.get())
    .bind(at)
    .bind(member_ids.len() as i32)
    .fetch_one(&mut *tx)
    .await?;
    let id = db::id(view.conversation_id)?;
    let members = insert_members(&mut tx, id, &member_ids, Watermark::ZERO, Some(creator)).await?;
    let mut events = vec![ChatEvent::ConversationCreated(ConversationCreated {
        conversation_id: id,
        conversation_type: ConversationKind::Group.as_str().into(),
        title,
        created_by: creator,
        occurred_at: at,
    })];
    events.extend(joined_events(
        id,
        &members,
        Watermark::ZERO,
        creator,
        Some(creator),
        at,
    ));
    db.outbox.write(&mut tx, &events).await?;
    if let Some(key) = key {
        idempotency::record(&mut tx, key, 201, &view).await?;
    }
    tx.commit().await?;
    Ok(Outcome::Done(view))
}

/// The single DIRECT conversation of `caller` and `peer`, and whether this call made it.
/// Concurrent calls for one pair race on `direct_pair`'s key: one inserts, the others
/// roll back and read the winner's conversation. A caller who left it rejoins; a caller
/// the peer blocked can neither open nor rejoin it.
///
/// With a key, the request that made the conversation records its answer (201) in the
/// same transaction, and a retry gets it again; a conversation that existed already is
/// answered 200 as without a key.
pub async fn open_direct(
    db: &Store,
    caller: UserId,
    peer: UserId,
    key: Option<&Keyed>,
) -> Result<Outcome<(ConversationView, bool)>, StoreError> {
    let (low, high) = if caller < peer {
        (caller, peer)
    } else {
        (peer, caller)
    };
    if let Some(key) = key {
        let mut conn = db.pool.acquire().await?;
        if let Some(first) = idempotency::first_answer(&mut conn, key).await? {
            return Ok(Outcome::Replayed(first));
        }
    }
    if let Some(view) = find_direct(db, caller, low, high).await? {
        let view = rejoin_direct(db, view, caller, peer).await?;
        return Ok(Outcome::Done((view, false)));
    }
    let at = now();
    let mut tx = db.pool.begin().await?;
    if let Some(key) = key {
        // A concurrent request with the same key made it: its answer.
        if let Some(first) = idempotency::claim(&mut tx, key).await? {
            return Ok(Outcome::Replayed(first));
        }
    }
    blocks::refuse_if_blocked_by(&mut tx, caller, peer).await?;
    let mut view: ConversationView = sqlx::query_as(&format!(
        "INSERT INTO conversation AS c (type, created_by, created_at, last_activity_at, member_count)
         VALUES ('DIRECT', $1, $2, $2, 2)
         RETURNING {VIEW_COLUMNS}, NULL::bigint AS peer_id"
    ))
    .bind(caller.get())
    .bind(at)
    .fetch_one(&mut *tx)
    .await?;
    let id: ConversationId = db::id(view.conversation_id)?;
    // Waits for a concurrent insert of the same pair to commit or roll back.
    let won = sqlx::query(
        "INSERT INTO direct_pair (user_low, user_high, conversation_id) VALUES ($1, $2, $3)
         ON CONFLICT (user_low, user_high) DO NOTHING",
    )
    .bind(low.get())
    .bind(high.get())
    .bind(id.get())
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !won {
        tx.rollback().await?;
        let view = find_direct(db, caller, low, high)
            .await?
            .ok_or(StoreError::Database(sqlx::Error::RowNotFound))?;
        return Ok(Outcome::Done((view, false)));
    }
    let members =
        insert_members(&mut tx, id, &[low.get(), high.get()], Watermark::ZERO, None).await?;
    let mut events = vec![ChatEvent::ConversationCreated(ConversationCreated {
        conversation_id: id,
        conversation_type: ConversationKind::Direct.as_str().into(),
        title: None,
        created_by: caller,
        occurred_at: at,
    })];
    events.extend(joined_events(
        id,
        &members,
        Watermark::ZERO,
        caller,
        None,
        at,
    ));
    db.outbox.write(&mut tx, &events).await?;
    view.peer_id = Some(peer.get());
    if let Some(key) = key {
        idempotency::record(&mut tx, key, 201, &view).await?;
    }
    tx.commit().await?;
    Ok(Outcome::Done((view, true)))
}

/// `view` as `caller` has it: unchanged for a member, and for one who left it, after
/// they are a member again (at its last seq, with their `member.joined`).
async fn rejoin_direct(
    db: &Store,
    mut view: ConversationView,
    caller: UserId,
    peer: UserId,
) -> Result<ConversationView, StoreError> {
    let id: ConversationId = db::id(view.conversation_id)?;
    // A member (the common case) is answered by the gate, without the row lock.
    match db.members.require(&db.pool, id, caller).await {
        Ok(()) => return Ok(view),
        Err(StoreError::NotFound { .. }) => {}
        Err(err) => return Err(err),
    }
    let mut tx = db.pool.begin().await?;
    let (last_seq, member): (i64, bool) = sqlx::query_as(
        "SELECT c.last_seq, EXISTS (SELECT 1 FROM conversation_member m
                                     WHERE m.conversation_id = c.id AND m.user_id = $2)
           FROM conversation c WHERE c.id = $1 FOR UPDATE",
    )
    .bind(id.get())
    .bind(caller.get())
    .fetch_one(&mut *tx)
    .await?;
    if member {
        return Ok(view);
    }
    blocks::refuse_if_blocked_by(&mut tx, caller, peer).await?;
    let start = db::id(last_seq)?;
    let added = insert_members(&mut tx, id, &[caller.get()], start, None).await?;
    view.member_count = sqlx::query_scalar(
        "UPDATE conversation SET member_count = member_count + 1,
                changed_xid = pg_current_xact_id()
          WHERE id = $1 RETURNING member_count",
    )
    .bind(id.get())
    .fetch_one(&mut *tx)
    .await?;
    let events: Vec<_> = joined_events(id, &added, start, caller, None, now()).collect();
    db.outbox.write(&mut tx, &events).await?;
    tx.commit().await?;
    view.last_seq = last_seq;
    Ok(view)
}

async fn find_direct(
    db: &Store,
    caller: UserId,
    low: UserId,
    high: UserId,
) -> Result<Option<ConversationView>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {VIEW_COLUMNS},
                CASE WHEN p.user_low = $3 THEN p.user_high ELSE p.user_low END AS peer_id
           FROM direct_pair p JOIN conversation c ON c.id = p.conversation_id
          WHERE p.user_low = $1 AND p.user_high = $2"
    ))
    .bind(low.get())
    .bind(high.get())
    .bind(caller.get())
    .fetch_optional(&db.pool)
    .await
}

/// What the membership lock returns: the conversation row, locked `FOR UPDATE`, and the
/// caller's role in it.
pub(super) struct Locked {
    pub(super) kind: ConversationKind,
    last_seq: i64,
    member_count: i32,
    pub(super) caller_role: Role,
}

/// Two statements on purpose. A statement reads with the snapshot it started with, and a
/// row lock it waited for does not refresh that snapshot for other tables: with the
/// membership test in the locking statement, a caller removed by the transaction that
/// held the lock still looked like a member, and their change committed after their
/// `member.left`. Asked after the lock is granted, the membership is as of now.
pub(super) async fn lock_as_member(
    conn: &mut PgConnection,
    conversation: ConversationId,
    caller: UserId,
) -> Result<Locked, StoreError> {
    let locked: Option<(ConversationKind, i64, i32)> = sqlx::query_as(
        "SELECT c.type, c.last_seq, c.member_count
           FROM conversation c WHERE c.id = $1 FOR UPDATE",
    )
    .bind(conversation.get())
    .fetch_optional(&mut *conn)
    .await?;
    let role: Option<String> = sqlx::query_scalar(
        "SELECT role FROM conversation_member WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conversation.get())
    .bind(caller.get())
    .fetch_optional(conn)
    .await?;
    match (locked, role) {
        (Some((kind, last_seq, member_count)), Some(role)) => Ok(Locked {
            kind,
            last_seq,
            member_count,
            caller_role: role.parse().map_err(StoreError::corrupt)?,
        }),
        _ => Err(StoreError::conversation_not_found()),
    }
}

/// Refuses a caller who is not an admin of the group.
fn require_admin(locked: &Locked, what: &str) -> Result<(), StoreError> {
    if locked.caller_role == Role::Admin {
        Ok(())
    } else {
        Err(StoreError::Forbidden {
            detail: format!("only the group's admins may {what}"),
        })
    }
}

/// The same for a membership change: only GROUPs have one; in a DIRECT conversation
/// its members only leave.
async fn lock_group_as_member(
    conn: &mut PgConnection,
    conversation: ConversationId,
    caller: UserId,
) -> Result<Locked, StoreError> {
    let locked = lock_as_member(conn, conversation, caller).await?;
    if locked.kind == ConversationKind::Direct {
        return Err(direct_membership_fixed());
    }
    Ok(locked)
}

fn direct_membership_fixed() -> StoreError {
    StoreError::conflict(
        "direct-membership-fixed",
        "a DIRECT conversation has its two members: each may leave it, nobody else joins",
    )
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersAdded {
    pub conversation_id: ConversationId,
    /// The users who were not members before this call.
    pub added: Vec<UserId>,
    pub member_count: i32,
    /// The watermark the new members start at: the conversation's last_seq.
    pub last_read_seq: Watermark,
}

/// Adds members to a GROUP. They start at `last_read_seq = last_seq`: no inherited unread.
/// All or nothing: past the cap, nobody is added.
pub async fn add_members(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    user_ids: &[i64],
    max_members: usize,
) -> Result<MembersAdded, StoreError> {
    db.members.require(&db.pool, conversation, caller).await?;
    let mut tx = db.pool.begin().await?;
    let locked = lock_group_as_member(&mut tx, conversation, caller).await?;
    require_admin(&locked, "add members")?;
    blocks::refuse_adding(&mut tx, caller, user_ids).await?;
    let start = db::id(locked.last_seq)?;
    let added = insert_members(&mut tx, conversation, user_ids, start, None).await?;
    let member_count = locked.member_count as usize + added.len();
    if member_count > max_members {
        // Dropping `tx` rolls the inserts back.
        return Err(member_limit(member_count, max_members));
    }
    sqlx::query(
        "UPDATE conversation SET member_count = $2, changed_xid = pg_current_xact_id()
          WHERE id = $1",
    )
    .bind(conversation.get())
    .bind(member_count as i32)
    .execute(&mut *tx)
    .await?;
    let events: Vec<_> = joined_events(conversation, &added, start, caller, None, now()).collect();
    db.outbox.write(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(MembersAdded {
        conversation_id: conversation,
        added,
        member_count: member_count as i32,
        last_read_seq: start,
    })
}

/// Removes a member: anyone may leave (a DIRECT conversation too, see the module docs),
/// an admin may remove anyone from a GROUP. When the last admin goes, the
/// longest-standing member becomes admin.
pub async fn remove_member(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    user: UserId,
) -> Result<(), StoreError> {
    db.members.require(&db.pool, conversation, caller).await?;
    let mut tx = db.pool.begin().await?;
    let locked = lock_as_member(&mut tx, conversation, caller).await?;
    if user != caller {
        if locked.kind == ConversationKind::Direct {
            return Err(direct_membership_fixed());
        }
        require_admin(&locked, "remove other members")?;
    }
    let removed: Option<String> = sqlx::query_scalar(
        // The departure is what tells the member's other devices, at their next sync,
        // that the conversation is gone for them.
        "WITH gone AS (
              DELETE FROM conversation_member WHERE conversation_id = $1 AND user_id = $2
              RETURNING user_id, role),
              unmentioned AS (
              DELETE FROM message_mention WHERE conversation_id = $1 AND user_id = $2),
              departure AS (
              INSERT INTO conversation_departure (user_id, conversation_id)
              SELECT user_id, $1 FROM gone
              ON CONFLICT (user_id, conversation_id)
              DO UPDATE SET departed_at = now(), changed_xid = pg_current_xact_id())
         SELECT role FROM gone",
    )
    .bind(conversation.get())
    .bind(user.get())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(removed_role) = removed else {
        return Err(StoreError::NotFound { what: "member" });
    };
    sqlx::query(
        "UPDATE conversation SET member_count = member_count - 1,
                changed_xid = pg_current_xact_id()
          WHERE id = $1",
    )
    .bind(conversation.get())
    .execute(&mut *tx)
    .await?;
    let at = now();
    let mut events = vec![ChatEvent::MemberLeft(MemberLeft {
        conversation_id: conversation,
        user_id: user,
        removed_by: caller,
        occurred_at: at,
    })];
    if removed_role == Role::Admin.as_str() {
        if let Some(heir) = promote_if_no_admin(&mut tx, conversation).await? {
            events.push(ChatEvent::MemberRoleChanged(MemberRoleChanged {
                conversation_id: conversation,
                user_id: heir,
                role: Role::Admin,
                changed_by: caller,
                occurred_at: at,
            }));
        }
    }
    db.outbox.write(&mut tx, &events).await?;
    tx.commit().await?;
    db.members.forget(conversation, user);
    Ok(())
}

/// Makes the longest-standing member admin if the group has members and no admin.
async fn promote_if_no_admin(
    conn: &mut PgConnection,
    conversation: ConversationId,
) -> Result<Option<UserId>, StoreError> {
    let heir: Option<i64> = sqlx::query_scalar(
        "UPDATE conversation_member SET role = 'ADMIN'
          WHERE conversation_id = $1
            AND user_id = (SELECT user_id FROM conversation_member
                            WHERE conversation_id = $1
                            ORDER BY joined_at, user_id LIMIT 1)
            AND NOT EXISTS (SELECT 1 FROM conversation_member
                             WHERE conversation_id = $1 AND role = 'ADMIN')
         RETURNING user_id",
    )
    .bind(conversation.get())
    .fetch_optional(conn)
    .await?;
    Ok(heir.map(db::id).transpose()?)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleSet {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub role: Role,
}

/// An admin makes a member admin, or an admin a member again. The last admin cannot
/// step down (409 `last-admin`): promote someone first, or leave (then the
/// longest-standing member takes over). Setting the role a member has changes nothing
/// and writes no event.
pub async fn set_role(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    user: UserId,
    role: Role,
) -> Result<RoleSet, StoreError> {
    db.members.require(&db.pool, conversation, caller).await?;
    let mut tx = db.pool.begin().await?;
    let locked = lock_group_as_member(&mut tx, conversation, caller).await?;
    require_admin(&locked, "change roles")?;
    let was: Option<String> = sqlx::query_scalar(
        "SELECT role FROM conversation_member WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conversation.get())
    .bind(user.get())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(was) = was else {
        return Err(StoreError::NotFound { what: "member" });
    };
    let answer = RoleSet {
        conversation_id: conversation,
        user_id: user,
        role,
    };
    if was == role.as_str() {
        return Ok(answer);
    }
    if role == Role::Member {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_member
              WHERE conversation_id = $1 AND role = 'ADMIN' AND user_id <> $2",
        )
        .bind(conversation.get())
        .bind(user.get())
        .fetch_one(&mut *tx)
        .await?;
        if others == 0 {
            return Err(StoreError::conflict(
                "last-admin",
                "the group's last admin cannot become a member: make another member admin first",
            ));
        }
    }
    sqlx::query(
        "UPDATE conversation_member SET role = $3 WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conversation.get())
    .bind(user.get())
    .bind(role.as_str())
    .execute(&mut *tx)
    .await?;
    let event = ChatEvent::MemberRoleChanged(MemberRoleChanged {
        conversation_id: conversation,
        user_id: user,
        role,
        changed_by: caller,
        occurred_at: now(),
    });
    db.outbox.write(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(answer)
}

#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct MemberEntry {
    pub user_id: i64,
    pub role: String,
    pub joined_at: DateTime<Utc>,
    pub last_read_seq: i64,
}

/// The members of a conversation the caller is in, longest-standing first.
pub async fn members(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
) -> Result<Vec<MemberEntry>, StoreError> {
    let members: Vec<MemberEntry> = sqlx::query_as(
        "SELECT m.user_id, m.role, m.joined_at, m.last_read_seq
           FROM conversation_member m
          WHERE m.conversation_id = $1
            AND EXISTS (SELECT 1 FROM conversation_member me
                         WHERE me.conversation_id = $1 AND me.user_id = $2)
          ORDER BY m.joined_at, m.user_id",
    )
    .bind(conversation.get())
    .bind(caller.get())
    .fetch_all(&db.pool)
    .await?;
    if members.is_empty() {
        return Err(StoreError::conversation_not_found());
    }
    Ok(members)
}

/// Inserts the users not yet members, at watermark `last_read_seq`, `admin` (if any) as
/// admin and the others as members; returns who was new.
async fn insert_members(
    conn: &mut PgConnection,
    conversation: ConversationId,
    user_ids: &[i64],
    last_read_seq: Watermark,
    admin: Option<UserId>,
) -> Result<Vec<UserId>, sqlx::Error> {
    let mut added: Vec<i64> = sqlx::query_scalar(
        // A new member has passed every deleted seq (they start at last_seq), and is
        // no longer departed if they had left before.
        "WITH added AS (
              INSERT INTO conversation_member
                     (conversation_id, user_id, last_read_seq, role, deleted_read)
              SELECT $1, u, $3, CASE WHEN u = $4 THEN 'ADMIN' ELSE 'MEMBER' END,
                     (SELECT c.deleted_count FROM conversation c WHERE c.id = $1)
                FROM unnest($2::bigint[]) AS u
              ON CONFLICT (conversation_id, user_id) DO NOTHING
              RETURNING user_id),
              returned AS (
              DELETE FROM conversation_departure d USING added a
               WHERE d.user_id = a.user_id AND d.conversation_id = $1)
         SELECT user_id FROM added",
    )
    .bind(conversation.get())
    .bind(user_ids)
    .bind(last_read_seq.get())
    .bind(admin.map(|a| a.get()))
    .fetch_all(conn)
    .await?;
    added.sort_unstable();
    added.into_iter().map(db::id).collect()
}

fn joined_events(
    conversation: ConversationId,
    users: &[UserId],
    last_read_seq: Watermark,
    added_by: UserId,
    admin: Option<UserId>,
    at: DateTime<Utc>,
) -> impl Iterator<Item = ChatEvent> + '_ {
    users.iter().map(move |&user_id| {
        ChatEvent::MemberJoined(MemberJoined {
            conversation_id: conversation,
            user_id,
            last_read_seq,
            added_by,
            role: if Some(user_id) == admin {
                Role::Admin
            } else {
                Role::Member
            },
            occurred_at: at,
        })
    })
}

fn member_limit(count: usize, max: usize) -> StoreError {
    metrics::counter!("member_limit_rejections_total").increment(1);
    StoreError::conflict(
        "member-limit",
        format!("{count} members would exceed the limit of {max}"),
    )
}
