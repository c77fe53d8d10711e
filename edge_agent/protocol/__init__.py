"""The wire: topic layout and every MQTT message as a versioned pydantic model (pure)."""
