"""The gateway's Prometheus metrics: the registry (the metric contract) and the calls each relay
point and session makes (telemetry).

Imports nothing else of api: every other part of the gateway reports through it.
"""
