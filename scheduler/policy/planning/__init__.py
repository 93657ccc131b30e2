"""From a request to a plan a person can check before anything runs: ``advise`` (a card, a competition and a budget
to a plan), the dry run (``dryrun``: a plan and the hardware to a placement), a spec settled by the planner's rules
(``settle``) and the learning rate a timm job trains at (``recipe``)."""
