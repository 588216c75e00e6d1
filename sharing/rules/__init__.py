"""The placement, replica and reshape rules the webhook, the controller, the agent and the product model share."""
