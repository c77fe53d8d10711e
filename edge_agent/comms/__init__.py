"""The MQTT session behind a three-method interface (publish, subscribe, stop), and its fake."""

from edge_agent.comms.base import Communicator, Handler, Message, MqttVersion, topic_matches
from edge_agent.comms.fake import FakeBroker, FakeCommunicator
from edge_agent.comms.settings import BrokerSettings, TlsSettings

__all__ = [
    "BrokerSettings",
    "Communicator",
    "FakeBroker",
    "FakeCommunicator",
    "Handler",
    "Message",
    "MqttVersion",
    "TlsSettings",
    "topic_matches",
]
