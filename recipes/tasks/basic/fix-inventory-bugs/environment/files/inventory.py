"""A tiny stock-keeping class."""


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty):
        """Add qty (> 0, else ValueError) units of name."""
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.items[name] = qty

    def remove(self, name, qty):
        """Remove qty units of name. ValueError if fewer than qty are in stock.
        An item whose quantity drops to 0 is deleted from self.items."""
        have = self.items.get(name, 0)
        if qty > have:
            raise ValueError(f"only {have} {name} in stock")
        self.items[name] = have - qty

    def total_value(self, prices):
        """Sum of quantity * prices[name] over all items (prices maps name -> unit price)."""
        return sum(qty * prices[name] for name, qty in self.items.items())

    def low_stock(self, threshold):
        """Names of items with quantity strictly below threshold, sorted alphabetically."""
        return [name for name, qty in self.items.items() if qty <= threshold]
