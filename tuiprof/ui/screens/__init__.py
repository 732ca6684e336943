"""Modal and full screens: help, kernel detail, eager-vs-compiled comparison."""
