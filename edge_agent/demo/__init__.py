"""`edge-agent demo`: the whole product on one machine, fleet side and device side.

A broker, a fleet that signs and publishes `person-ssdlite`, an agent that
deploys it over MQTT behind the health gate and runs a pipeline on a video
built from sample photos, and a console that shows what the fleet sees.
"""
