"""Pure decisions: estimate, fit, packing, online placement, budget, batch tuning and advice, ensemble."""
