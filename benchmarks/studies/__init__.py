"""One-off studies behind figures the lessons quote (lesson 9's "why not 1.7x", lesson 7's prefill
ceiling): kept so those figures can be reproduced, not run routinely."""
