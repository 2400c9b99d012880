"""Reading the world: request rates (Prometheus or direct scrape) and one cluster snapshot per cycle."""
