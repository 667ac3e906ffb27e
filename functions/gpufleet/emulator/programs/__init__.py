"""Small programs the embedded account's demos run as real containers' commands."""
