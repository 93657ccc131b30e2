"""Which job goes on which device, in which wave: the offline packer (``packing``, its problem, exact search and
wave-by-wave proof, arc-flow bound and host-RAM pass) and the service's online placement of one request at a time
(``placement_online``, with the workload it learns, ``placement_workload``)."""
