"""After a reconnect: which of the retained messages held the broker did not send again.

On a resubscribe the broker sends every retained message it holds, and only those: one it
no longer holds (a broker restarted without persistence, a message cleared while this
client was away) is not sent, and nothing says so. A client that keeps what it learned
from retained messages (the console's device states, a fleet server's peers) went on
holding such a one as current for good.

So at every reconnect each name held waits to be heard again (`Recheck.heard`). MQTT says
no end to the retained messages a (re)subscription brings, so the client sends itself an
echo: subscribed after the session resubscribed every filter and published after that,
it comes back behind the retained messages, and a name still waiting then has no message
on the broker. One whose retained message does come is never given up: it arrives before
the echo. A settle window instead would have to guess how long 5,000 messages take, and
flap past it. Both the console's roster (fleet/roster.py) and `serve` (fleet/server.py)
use this.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from edge_agent.comms.base import Communicator, Unsubscribe

SETTLE_MAX_S = 10.0
"""After a reconnect, how long to wait for the echo before taking the retained burst as
over all the same. The echo comes back in milliseconds behind the burst, but at QoS 0 (at
a higher QoS than the messages it follows it could pass them) a session whose handlers
fall behind drops it (`dispatch_limit_bytes`); an ACL may refuse it. Without this, one
lost echo left everything held after a reconnect unchecked for good."""


class Recheck:
    """The names held at the last reconnect that have not been heard again since.

    Args:
        lock: The owner's lock, guarding what it holds: `gone` is called holding it, and
            `heard` and `waiting` are to be.
        gone: Given the names not heard again once the retained burst is over (empty
            when every one was), holding `lock`; the owner lets them go, or marks them.
        qos: That of the subscriptions whose retained messages the echo follows: at
            another, it could pass them.
        settle_max_s: See SETTLE_MAX_S.
        lost: Given the echo topic and the names about to be given up, holding `lock`,
            when the wait for the echo ended without it (SETTLE_MAX_S): the owner says so,
            or the names let go then are gone with no reason given.
    """

    def __init__(
        self,
        lock: AbstractContextManager[object],
        gone: Callable[[set[str]], None],
        *,
        qos: int,
        settle_max_s: float = SETTLE_MAX_S,
        lost: Callable[[str, set[str]], None] | None = None,
    ) -> None:
        self._lock = lock
        self._gone = gone
        self._lost = lost
        self._qos = qos
        self._settle_max_s = settle_max_s
        # Since the last reconnect: the names not heard again, which link that was (a
        # later one makes an earlier one's echo and timer moot), and what undoes its echo
        # subscription and timer.
        self._waiting: set[str] = set()
        self._link = 0
        self._echo: tuple[Unsubscribe, threading.Timer] | None = None

    def reconnected(self, comm: Communicator, echo: str, held: Callable[[], Iterable[str]]) -> None:
        """To be called on every connect of `comm`, before that link's messages are handled
        (`MqttSession`'s `on_connected` is, on the thread that then hands them over), and
        not holding the lock.

        Args:
            comm: The session that (re)connected.
            echo: A topic of this client's own, fresh for the link, that it may read and
                write: the echo is an empty message there.
            held: Called holding the lock: the names that are to be heard again. With
                none (a first connect: nothing held yet), no echo is sent.
        """
        with self._lock:
            self._link += 1
            link = self._link
            self._waiting = set(held())
            pending = bool(self._waiting)
            previous, self._echo = self._echo, None
        self._let_go(previous)
        if not pending:
            return
        timer = threading.Timer(self._settle_max_s, self._settle, args=(link, echo))
        timer.daemon = True
        undo = comm.subscribe(echo, lambda _message: self._settle(link), qos=self._qos)
        with self._lock:
            current = link == self._link
            if current:
                self._echo = (undo, timer)
        if not current:  # the link went and came back meanwhile: that one checks
            self._let_go((undo, timer))
            return
        timer.start()
        comm.publish(echo, b"", qos=1)

    def heard(self, name: str) -> None:
        """`name`'s message came again (or it went away for good): no longer waited for.
        Holding the lock."""
        self._waiting.discard(name)

    def waiting(self, name: str) -> bool:
        """Whether `name` is held but not heard again since the reconnect. Holding the lock."""
        return name in self._waiting

    def _settle(self, link: int, lost_echo: str | None = None) -> None:
        """The retained messages of `link` have all come (or, `lost_echo` given, its echo
        did not come in time): give up the names still waiting."""
        with self._lock:
            if link != self._link or self._echo is None:
                return  # a later link's, or settled already
            if lost_echo is not None and self._lost is not None:
                self._lost(lost_echo, set(self._waiting))
            self._gone(self._waiting)
            self._waiting = set()
            done, self._echo = self._echo, None
        self._let_go(done)

    @staticmethod
    def _let_go(echo: tuple[Unsubscribe, threading.Timer] | None) -> None:
        if echo is not None:
            undo, timer = echo
            timer.cancel()
            undo()
