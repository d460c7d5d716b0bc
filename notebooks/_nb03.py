CELLS = [("md", "# placeholder")]
