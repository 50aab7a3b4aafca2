"""Running accelmux as a systemd service: unit files rendered from typed descriptions
(:mod:`.unit`), the daemon's own unit (:mod:`.daemon_unit`), writing and enabling them
(:mod:`.install`), and the daemon's readiness and watchdog notifications
(:mod:`.notify`). ``accelmux service install`` is :mod:`.command`.
"""
