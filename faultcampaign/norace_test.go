//go:build !race

package faultcampaign_test

const raceEnabled = false
