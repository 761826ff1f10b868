"""tasks/conversation.py against a real Redis: the worker writes the conversation so far again
after an outage (Redis may have restarted empty), once per outage."""

from __future__ import annotations

import orjson
import redis

from streaming.keys import Keys
from tasks.conversation import Conversation

SID = "rt_1_talk"


def test_the_conversation_is_written_again_once_after_each_outage(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    talk = Conversation(sync_redis, keys, SID, ttl_s=60)
    talk.after_outage(0)  # no outage yet, nothing said: nothing written
    assert not sync_redis.exists(keys.session_history(SID))
    talk.heard("hello there")
    talk.said("hi")
    talk.end_response()
    sync_redis.delete(keys.session_history(SID))  # Redis restarted empty
    talk.after_outage(1)
    saved = orjson.loads(sync_redis.get(keys.session_history(SID)) or b"[]")
    assert saved == [
        {"role": "user", "text": "hello there"},
        {"role": "assistant", "text": "hi"},
    ]
    assert 0 < sync_redis.ttl(keys.session_history(SID)) <= 60
    sync_redis.delete(keys.session_history(SID))
    talk.after_outage(1)  # the same outage: not again
    assert not sync_redis.exists(keys.session_history(SID))
