"""spotrelay's infrastructure (AWS CDK): one construct per concern, composed by `SchedulerStack`."""
