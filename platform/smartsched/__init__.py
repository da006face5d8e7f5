"""SmartSched."""
