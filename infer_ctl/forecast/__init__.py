"""Request-rate forecasters (pure): fit(history) -> fitted, fitted.predict(horizon)."""
