"""dflash's Python side: chat data preparation (`dflash prepare`,
docs/CHAT_DATA.md)."""
