"""How long things take: images per second and a job's seconds (``timemodel``), one task's time field by field
(``tasktime``), the slowdown of jobs sharing a card (``colocation``, ``packgain``), a plan's tasks where the placement
puts them (``plantime``) and when each starts and ends (``timeline``), and predicted against actual
(``timerecord``)."""
