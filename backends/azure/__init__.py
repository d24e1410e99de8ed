"""Azure (planned: offers come from the price catalog; runs are not dispatched in this version)."""
