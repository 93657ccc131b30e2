"""What the driver does while a run goes: the run loop's state machine (``runloop``, its messages ``runmessages``)
over a plan's tasks (``tasks``), the time budget's cuts and give-backs (``budget``), and the rules over what telemetry
reports (``advice``)."""
