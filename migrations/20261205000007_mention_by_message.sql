-- A message's mention rows, by message: history and sync show who each message names,
-- and edits and deletes change them (chat_set_mentions). The primary key
-- (conversation_id, user_id, seq) serves the watermark moves' range counts; without
-- this index those lookups read every mention row of the conversation.
CREATE INDEX message_mention_by_message ON message_mention (conversation_id, seq);
