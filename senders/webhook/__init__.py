"""The HTTP webhook sender: batches of JSON changes POSTed to a URL."""

from senders.kind import SenderKind

KIND = SenderKind("webhook", "senders.webhook.sender:WebhookSender", check="senders.webhook.check",
                  doc="an HTTP endpoint (POST batches of JSON changes)")
