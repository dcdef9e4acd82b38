-- Group roles. The creator of a group is its admin; only admins add or remove other
-- members and change roles; anyone may leave. When the last admin leaves, the member who
-- joined first becomes admin (ingest-api does it in the leaving transaction), so a group
-- with members always has one. DIRECT conversations have no admin: their two members
-- are fixed.
ALTER TABLE conversation_member
    ADD COLUMN role TEXT NOT NULL DEFAULT 'MEMBER' CHECK (role IN ('ADMIN', 'MEMBER'));

-- Groups made before roles existed: the creator, where still a member, is admin ...
UPDATE conversation_member m SET role = 'ADMIN'
  FROM conversation c
 WHERE c.id = m.conversation_id AND c.type = 'GROUP' AND m.user_id = c.created_by;

-- ... and a group its creator left gets its longest-standing member as admin.
UPDATE conversation_member m SET role = 'ADMIN'
  FROM (SELECT DISTINCT ON (cm.conversation_id) cm.conversation_id, cm.user_id
          FROM conversation_member cm
          JOIN conversation c ON c.id = cm.conversation_id AND c.type = 'GROUP'
         WHERE NOT EXISTS (SELECT 1 FROM conversation_member a
                            WHERE a.conversation_id = cm.conversation_id AND a.role = 'ADMIN')
         ORDER BY cm.conversation_id, cm.joined_at, cm.user_id) first
 WHERE m.conversation_id = first.conversation_id AND m.user_id = first.user_id;
