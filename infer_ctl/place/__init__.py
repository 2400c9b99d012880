"""Placement over DRA devices (pure): inventory, CEL selectors, filter and score plugins, claims."""
