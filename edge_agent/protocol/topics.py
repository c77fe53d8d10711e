"""Every topic edge-agent uses, built in one place from a configurable prefix (pure).

Device topics live under `<prefix>/<device_id>/`; fleet-wide ones under
`<prefix>/releases/`, `<prefix>/delivery/`, `<prefix>/group/` and `<prefix>/fleet/`,
so those words are not valid device ids.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "edge/v1"
RESERVED_IDS = frozenset({"releases", "delivery", "group", "fleet"})
DEFAULT_SHARE_GROUP = "edge-fleet"


def check_prefix(value: str) -> str:
    """A topic prefix as every topic is built on it, or ValueError: no wildcards (a
    subscription filter built on one would match the wrong topics, and a broker refuses
    them in topic names), no NUL, not empty and not starting with '/'. A trailing '/' is
    dropped."""
    if not value or any(c in value for c in "#+\0") or value.startswith("/"):
        raise ValueError("a topic prefix has no wildcards and does not start with '/'")
    return value.rstrip("/")


FANIN_QOS = 0
"""What the fleet side subscribes with to what every device sends: states, telemetry and
answers (the console), joins, acks and repair requests (`serve`). A broker holds back
QoS 1 deliveries to one client past a few in flight and queues a bounded number more,
then drops the rest: mosquitto's defaults (20 and 1,000) let 1,020 of a 5,000-box
fleet's retained states through, and dropped final answers of a group deploy, which
then read as time-outs. At QoS 0 it sends them without waiting for acknowledgements, as
fast as the client reads (one that falls far behind can still lose some past the
broker's `max_queued_messages`). The devices still publish at QoS 1; the retained states
come again when the subscription is made anew, and devices rejoin and resend."""


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names below `prefix` (default edge/v1)."""

    prefix: str = DEFAULT_PREFIX

    # --- one device -----------------------------------------------------------------------
    def device(self, device_id: str, leaf: str) -> str:
        return f"{self.prefix}/{device_id}/{leaf}"

    def _levels(self, topic: str) -> list[str] | None:
        """The levels of `topic` below the prefix; None for a topic under no prefix of ours."""
        head, sep, rest = topic.partition(self.prefix + "/")
        return None if head or not sep else rest.split("/")

    def device_of(self, topic: str) -> str | None:
        """The device a `<prefix>/<device>/...` topic belongs to; None for another topic."""
        levels = self._levels(topic)
        if levels is None or len(levels) < 2 or not levels[0]:
            return None
        return levels[0]

    def delivery_reply(self, device_id: str) -> str:
        """Where the fleet answers a device's repair requests (its MQTT 5 Response Topic)."""
        return self.device(device_id, "delivery")

    # --- a device's own delivery topics ---------------------------------------------------
    # A device's joins, acks, leaves and repair requests go under its own id, where a
    # broker ACL can tie them to the box that sent them (`pattern write .../%u/...`): on
    # the fleet-wide `ctl` and `repair` topics every box wrote every one, so any box could
    # join, leave and ask for repairs in another's name. The fleet-wide ones stay for
    # devices of earlier builds (`control`, `repair`).
    def own_control(self, device_id: str, name: str, version: int) -> str:
        """A device's join, ack and leave for one release's broadcast."""
        return self.device(device_id, f"delivery/ctl/{name}/{version}")

    @property
    def own_control_filter(self) -> str:
        return f"{self.prefix}/+/delivery/ctl/+/+"

    def own_repair(self, device_id: str) -> str:
        """A device's repair requests (fleet servers share them)."""
        return self.device(device_id, "delivery/repair")

    @property
    def own_repair_filter(self) -> str:
        return f"{self.prefix}/+/delivery/repair"

    def parse_own_control(self, topic: str) -> tuple[str, str, int] | None:
        """(device, name, version) of an `own_control` topic; None if it is not one."""
        parts = self._levels(topic)
        if parts is None or len(parts) != 5 or parts[1:3] != ["delivery", "ctl"]:
            return None
        device, _, _, name, text = parts
        version = _version(text)
        if device in RESERVED_IDS or not device or not name or version is None:
            return None
        return device, name, version

    def own_repair_device(self, topic: str) -> str | None:
        """The device of an `own_repair` topic; None if it is not one."""
        levels = self._levels(topic)
        if levels is None or len(levels) != 3 or levels[1:] != ["delivery", "repair"]:
            return None
        return None if not levels[0] or levels[0] in RESERVED_IDS else levels[0]

    def group(self, group: str, leaf: str) -> str:
        """A group's topic, e.g. `group(g, "cmd")`: every device in group `g` takes it."""
        return f"{self.prefix}/group/{group}/{leaf}"

    # --- releases ---------------------------------------------------------------------------
    def release(self, name: str, version: int) -> str:
        """Retained signed release of one version."""
        return f"{self.prefix}/releases/{name}/{version}"

    def release_latest(self, name: str) -> str:
        """Retained copy of the newest release of `name`."""
        return f"{self.prefix}/releases/{name}/latest"

    @property
    def releases_filter(self) -> str:
        return f"{self.prefix}/releases/+/+"

    # --- delivery ---------------------------------------------------------------------------
    def chunks(self, name: str, version: int) -> str:
        """The paced broadcast of one release's chunks (QoS 0, binary frames)."""
        return f"{self.prefix}/delivery/{name}/{version}/chunks"

    def status(self, name: str, version: int) -> str:
        """The broadcaster's status for one release: passes done, idle."""
        return f"{self.prefix}/delivery/{name}/{version}/status"

    def control(self, name: str, version: int) -> str:
        """Devices' join, ack and leave for one release's broadcast, as devices of earlier
        builds send them (a device now sends its own: `own_control`)."""
        return f"{self.prefix}/delivery/{name}/{version}/ctl"

    @property
    def control_filter(self) -> str:
        return f"{self.prefix}/delivery/+/+/ctl"

    @property
    def repair(self) -> str:
        """Repair requests as devices of earlier builds send them (`own_repair` now)."""
        return f"{self.prefix}/delivery/repair"

    def shared(self, topic_filter: str, group: str = DEFAULT_SHARE_GROUP) -> str:
        """The MQTT 5 shared subscription to `topic_filter` fleet servers take repair
        requests with: each request goes to one of them."""
        return f"$share/{group}/{topic_filter}"

    def server(self, instance: str) -> str:
        """A fleet server's retained presence (cleared by its will)."""
        return f"{self.prefix}/fleet/servers/{instance}"

    @property
    def servers_filter(self) -> str:
        return f"{self.prefix}/fleet/servers/+"

    def parse_control(self, topic: str) -> tuple[str, int] | None:
        """(name, version) of a fleet-wide `control` topic; None if it is not one."""
        parts = self._levels(topic)
        if parts is None or len(parts) != 4 or parts[0] != "delivery" or parts[3] != "ctl":
            return None
        version = _version(parts[2])
        return None if not parts[1] or version is None else (parts[1], version)


def _version(text: str) -> int | None:
    """A release version as a topic level spells it: ASCII digits only (`str.isdigit` takes
    '²', which `int` refuses, and '٣', which it reads as 3), and not a thousand of them."""
    if text.isascii() and text.isdigit() and len(text) <= 9:
        return int(text)
    return None
