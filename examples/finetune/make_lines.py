"""Write the pirate port's larger line set: the 206 hand-written lines plus lines composed from
hand-written sentences, in the same voice.

    python examples/finetune/make_lines.py            # -> examples/finetune/pirate_port_more.csv

Every sentence below was written for one archetype and one kind of moment, so that any two of
its pool read as one speaker's line:

* ``LEADS[archetype][state]``: what the speaker is doing or feeling in that behaviour state
  (the state is audible in every composed line);
* ``REPLIES[archetype][tone][intent]``: an answer to the player's move, for a tone shared by
  several states (``calm``: working, idle, patrol; ``warm``: friendly, rest; ``wary``: alert;
  ``fight``: combat, flee) — it never names the place or a state-specific action;
* ``TIDE[archetype][urgent?][value]``: a sentence that says the tide is low or high (only in
  lines whose prompt has that ``tide`` value; lines without ``tide`` never mention the water's
  height, so the fine-tune learns that the tag decides it);
* ``MOODS[trait]``: a short opener that voices a persona trait, and the intents it suits (lines
  tagged with that trait, calm and warm states only).

A composed line is *lead + reply*, *reply* alone, *lead* alone (``approach``: the player just
walked up), *tide + reply*, *lead + tide* (``approach``) or *mood + reply*. Each
(archetype, state, intent) cell draws a fixed number of distinct compositions (seeded), so the
file is the same on every run. The new archetypes declare where their control token starts
(``like``): a quartermaster starts as the base merchant, a smuggler as the thief, a harbormaster
as the guard.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
AUTHORED = HERE / "pirate_port.csv"
OUT = HERE / "pirate_port_more.csv"
STATES = ("working", "idle", "patrol", "friendly", "rest", "alert", "combat", "flee")
INTENTS = ("approach", "greet", "ask_directions", "ask_rumors", "trade", "threaten", "farewell")
TONE = {"working": "calm", "idle": "calm", "patrol": "calm", "friendly": "warm", "rest": "warm",
        "alert": "wary", "combat": "fight", "flee": "fight"}
LIKE = {"quartermaster": "merchant", "smuggler": "thief", "harbormaster": "guard"}

LEADS: dict[str, dict[str, list[str]]] = {
    "quartermaster": {
        "working": [
            "Forty casks of water and thirty of rum, and I count every one.",
            "Ink on my fingers and salt in the ledger, as usual.",
            "Every barrel gets counted twice before it goes aboard.",
            "I've a manifest here that won't balance itself.",
            "Rope, tar, biscuit, powder: all of it passes through my hands.",
        ],
        "idle": [
            "Nothing to load and nothing to count. I hate days like this.",
            "The ledger's closed and I don't know what to do with my hands.",
            "A quiet deck makes me nervous. Something's always missing.",
            "No ships to victual today, so I'm counting gulls instead.",
            "Idle stores are safe stores, but I'd still rather be busy.",
        ],
        "patrol": [
            "I walk the hold at every bell, and the rats know my step.",
            "Checking the locks on the stores, one by one.",
            "Third round of the storerooms tonight, and I'll do a fourth.",
            "Every seal on every cask, that's what I'm looking at.",
            "The stores don't guard themselves, so I walk them.",
        ],
        "friendly": [
            "Your share came out even this time. I checked it twice.",
            "You paid what you owed, and on time. That makes you rare in this port.",
            "Ah, a face I don't have to watch. Welcome.",
            "For a friend of the ship, the ledger can wait a moment.",
            "Good to see you. The crew speaks well of you, and they speak ill of everyone.",
        ],
        "rest": [
            "Let a tired man finish his pipe.",
            "The numbers can wait till morning.",
            "My boots are off and the ledger's shut.",
            "I dreamed of a ledger that balanced. Best dream I've had in years.",
            "A mug of warm rum and nobody asking for anything. Almost perfect.",
        ],
        "alert": [
            "Who's been at the powder store? The seal's broken.",
            "Something's wrong with the count, and I mean to find it.",
            "A cask went missing from the hold last night.",
            "There's a light in the storeroom that I didn't leave burning.",
            "Nobody boards without my mark on the manifest.",
        ],
        "combat": [
            "Hold the gangway! Nobody touches the stores!",
            "Back, you bilge rat! The cargo stays where it is!",
            "I've broken ledgers over harder heads than yours!",
            "Grab a boathook and keep them off the hold!",
            "Not one biscuit leaves this ship while I stand!",
        ],
        "flee": [
            "Save the ledger! Leave the rest!",
            "The stores are lost, so run while you can!",
            "I've the only copy of the accounts, and I'm not dying with it!",
            "Let the casks burn! Get to the boats!",
            "Out of my way, the hold's on fire!",
        ],
    },
    "smuggler": {
        "working": [
            "These crates are full of nothing, if anyone asks.",
            "Careful with that one. It's fragile, and so is my temper.",
            "Lace, pepper and a little brandy, all very quiet.",
            "Wrap the oars in sacking. Quiet work is the only kind I do.",
            "I move what other folk can't, and I don't ask what's inside.",
        ],
        "idle": [
            "Waiting on a boat that isn't coming. Story of my life.",
            "No cargo tonight, so I'm just a fisherman with clean hands.",
            "Fine evening for honest work. Shame I don't do any.",
            "Nothing to run and nobody to bribe. Dull as ditchwater.",
            "I'm mending a sail I'll never use, just to look busy.",
        ],
        "patrol": [
            "Every cove between here and the point, twice a night.",
            "Just walking, just walking. Nothing to see on this beach.",
            "I check the caves before the cargo comes in.",
            "Cliff path, sea steps, back to the cove. Same round every night.",
            "I'm watching for the customs boat, same as every night.",
        ],
        "friendly": [
            "You kept your mouth shut last time. That earns you a drink.",
            "Ah, a friend. Friends are rarer than brandy on this coast.",
            "You I trust, and I don't say that to many.",
            "Sit down, friend. Nobody's listening on this side of the cove.",
            "For you, a real bottle. Not the colored water I sell the sailors.",
        ],
        "rest": [
            "A hammock, a bottle and no customs men. That's all I ask.",
            "I've earned this nap, so keep your voice down.",
            "Let me sleep. The next run is a long one.",
            "Feet up and hat over my eyes. Do not disturb.",
            "Three nights without sleep. Tonight I rest.",
        ],
        "alert": [
            "Customs boat. Nobody breathes.",
            "Did you hear a whistle? That's the watch signal.",
            "Somebody talked, and I mean to find out who.",
            "Douse that lantern. Someone's watching the cove.",
            "Something smells wrong tonight.",
        ],
        "combat": [
            "You should have stayed in the tavern!",
            "Nobody takes my cargo! Nobody!",
            "I fight dirty, friend. Ask anyone who's left.",
            "Into the water with them!",
            "Knives out, lads! They found the cove!",
        ],
        "flee": [
            "Scatter! Meet at the old chapel!",
            "Leave the brandy! Run!",
            "The cave! They won't follow us in there!",
            "Drop the crates and run for the cliffs!",
            "They've found us! Every man for himself!",
        ],
    },
    "harbormaster": {
        "working": [
            "Every ship that ties up here answers to me.",
            "I keep the tide tables, the harbor dues and the peace, in that order.",
            "Three ships in, two waiting, and one with no papers at all.",
            "Sign here, and here. The governor wants every name.",
            "Berths, dues and papers, all day long.",
        ],
        "idle": [
            "Flat calm and an empty harbor. I could get used to this.",
            "No sails on the water today. Nothing to log but gulls.",
            "The dues are counted and the berths are empty.",
            "I've watched this harbor for thirty years. It still surprises me.",
            "Not a single ship to wave in. A strange, slow day.",
        ],
        "patrol": [
            "Walking the piers. A loose line sinks more ships than any storm.",
            "Every mooring checked, every lantern lit. That's the job.",
            "One more pier to walk, then the sea wall.",
            "I check every knot on every line, twice a night.",
            "Somebody left a net across the channel, and I'll find out who.",
        ],
        "friendly": [
            "Your berth's paid through the month. I saw to it.",
            "You keep a tidy ship. I wish every captain did.",
            "Welcome back to port. The harbor's been dull without you.",
            "For you, the good mooring by the steps.",
            "A captain who pays on time is a friend of mine.",
        ],
        "rest": [
            "My watch is done. Someone else can worry about the harbor.",
            "The harbor's asleep, and so should I be.",
            "A kettle on and the logbook shut. Bliss.",
            "I've walked every pier today. My feet are done.",
            "Let the night watch ring the bell. I'm off duty.",
        ],
        "alert": [
            "There's a sail without a lantern at the mouth of the harbor.",
            "A ship came in last night flying no colors. I've got my eye on her.",
            "Somebody's been at the mooring lines.",
            "The harbor bell rang twice, and nobody's owned up to it.",
            "Strangers on my pier after dark. I don't like it.",
        ],
        "combat": [
            "Raise the chain! Don't let them reach the inner harbor!",
            "This is my harbor, and you'll leave it in irons!",
            "Fire on the pier! Buckets, now!",
            "Hold the sea wall! Not one of them sets foot on the quay!",
            "Ring the bell and rouse the watch!",
        ],
        "flee": [
            "Abandon the pier! Up to the watch house!",
            "Take the tide tables! The rest can burn!",
            "The harbor's lost! Run for the town!",
            "Cut the lines and let the ships drift! Run!",
            "Off the pier, everyone, now!",
        ],
    },
}

REPLIES: dict[str, dict[str, dict[str, list[str]]]] = {
    "quartermaster": {
        "calm": {
            "approach": ["What do you want, {player}? Speak plainly.",
                         "Mind the casks, {player}. They're counted.",
                         "Something you need, {player}? Make it quick."],
            "greet": ["Morning, {player}. State your business and your debts.",
                      "Well met, {player}. You're not on my list, so you owe me nothing yet.",
                      "Aye, hello. Don't touch anything."],
            "ask_directions": ["The chandler's shop is past the fish market. Tell him the quartermaster sent you.",
                               "The harbormaster's office is the one with the bell. You can't miss it.",
                               "The rope walk is down the hill, past the tar pits. Follow your nose."],
            "ask_rumors": ["Word is the Gull's Wake came back light. Somebody sold her cargo before she made port.",
                           "They say the captain keeps a second ledger. I say they talk too much.",
                           "You can tell a lot about a crew by what they steal first. This lot took the sugar."],
            "trade": ["Rope's two coppers a fathom. Tar's extra, and I don't haggle.",
                      "If you're buying, show me the silver first.",
                      "You want {item}? I'll write it down, and you'll pay before it leaves the hold."],
            "threaten": ["Touch my stores and you'll be counting your fingers.",
                         "Threaten me again and your name goes in the book, in red.",
                         "I've faced down whole crews over a missing cask. You don't worry me."],
            "farewell": ["Off you go. I've a manifest that won't read itself.",
                         "Fair winds, {player}. Pay your debts before you sail.",
                         "Go on, then. Close the hatch behind you."],
        },
        "warm": {
            "approach": ["Sit a while, {player}, but mind the tally sticks.",
                         "Here, take this biscuit. It's the only one without weevils.",
                         "Come in out of the wind, {player}."],
            "greet": ["Hello, {player}. Good to see an honest face.",
                      "Ah, {player}! Pull up a cask and sit.",
                      "Good evening, {player}. The crew's been asking after you."],
            "ask_directions": ["The net maker on the quay will set you right. Tell him I sent you.",
                               "Follow the quay to the fish market, then up the steps. You'll be fine.",
                               "The chandler's shop is past the fish market. Go careful on the steps."],
            "ask_rumors": ["The net maker on the quay knows every rumor before it's true. Try him.",
                           "Between us, the captain owes more than the ship is worth.",
                           "They say a merchant ship is due with spice. My nose says they're right."],
            "trade": ["For you I'll open the good cask. Don't tell the crew.",
                      "Need rope or lamp oil? I'll knock a copper off for a friend.",
                      "You want {item}? For you, at cost, and that's a rare thing."],
            "threaten": ["Now, now, {player}. Friends don't talk like that.",
                         "Put that away. You're better than that, and so am I.",
                         "I'll forget you said that, this once."],
            "farewell": ["Go careful, {player}. The port eats the careless.",
                         "Good night, {player}. Don't let the gulls have your boots.",
                         "Fair winds, friend. Come back with your purse full."],
        },
        "wary": {
            "approach": ["Hands where I can see them, {player}.",
                         "Stop right there. Who sent you below?",
                         "Not another step toward that hold."],
            "greet": ["Stop right there. Who let you aboard?",
                      "Hello yourself. Now turn out your pockets.",
                      "Aye, {player}. What brings you near the stores at this hour?"],
            "ask_directions": ["Directions? The way off this dock is behind you.",
                               "Back up the gangway, and keep walking.",
                               "Ask the watch. I'm busy looking for a thief."],
            "ask_rumors": ["You heard something? Then speak up, quick.",
                           "If you know who broke that seal, tell me now.",
                           "Rumors can wait. Somebody's been at my stores."],
            "trade": ["Not now. Something's wrong with the count.",
                      "No trading until I find what's missing.",
                      "The hold's shut until I say otherwise."],
            "threaten": ["One more step toward that hold and I call the watch.",
                         "Try it, and you'll hang from the yardarm by morning.",
                         "I've a boathook within reach, and I know how to use it."],
            "farewell": ["Go, and keep your eyes open on the way out.",
                         "Leave, and don't come back without the captain.",
                         "Off the dock, {player}. Now."],
        },
        "fight": {
            "approach": ["Move, {player}! Don't just stand there!",
                         "Get out of the way!",
                         "Keep your head down, {player}!"],
            "greet": ["No time for hellos, {player}!",
                      "Hello? Now? Are you mad?",
                      "Save your greetings for when we're alive!"],
            "ask_directions": ["Anywhere but here! Go!",
                               "Down the gangway and don't look back!",
                               "To the boats, and be quick about it!"],
            "ask_rumors": ["Rumors? Look around you!",
                           "Ask me again when the shouting stops!",
                           "The only news is we're losing!"],
            "trade": ["No trading now, fool!",
                      "Trade? The stores are burning!",
                      "Keep your silver! Save your skin!"],
            "threaten": ["Stand in my way and I'll go through you!",
                         "You want a fight too? Get in line!",
                         "Out of my way or into the water!"],
            "farewell": ["Later, {player}! If there is a later!",
                         "Go! Don't wait for me!",
                         "Run, {player}, and don't come back for the ledger!"],
        },
    },
    "smuggler": {
        "calm": {
            "approach": ["Keep walking, {player}. You didn't see me.",
                         "Don't stare, friend. It's bad for your health.",
                         "Something you want, {player}? Ask quietly."],
            "greet": ["You didn't see me, I didn't see you. That's the whole bargain.",
                      "Evening, {player}. Keep your voice down.",
                      "Hello, friend. Who told you to look for me here?"],
            "ask_directions": ["The old net sheds are north of the quay. Nobody goes there. That's the point.",
                               "There's a cave under the lighthouse, if you know where the steps are. You don't.",
                               "Take the back alleys to the quay. The watch never walks them after dark."],
            "ask_rumors": ["The customs man drinks at the Drowned Lantern. Buy him two and he forgets his own name.",
                           "Buy me a drink and I'll tell you something worth ten.",
                           "They say the governor's wife buys my silk. They say right."],
            "trade": ["Looking for something you can't buy in the market? Maybe. Maybe not.",
                      "Half up front, half when it's landed. No exceptions.",
                      "You want {item}? It'll cost you more than silver."],
            "threaten": ["Say one word to the harbormaster and you'll be swimming home.",
                         "Careful. Folk who threaten me end up under the pier.",
                         "Brave talk for someone so far from the watch."],
            "farewell": ["Go on, then. Forget my face on the way.",
                         "We never met, {player}.",
                         "Off you go. And if anyone asks, you were never here."],
        },
        "warm": {
            "approach": ["Mind the loose step on the way down. It's saved my neck more than once.",
                         "Come, sit. Nobody's listening.",
                         "There's a dry spot by the fire, {player}. Take it."],
            "greet": ["{player}! Sit down before someone sees you.",
                      "Hello, friend. Good to see a face I trust.",
                      "Ah, {player}. Still alive, I see. Good."],
            "ask_directions": ["Take the back alleys to the quay, friend. The watch never walks them.",
                               "Follow the beach to the point, then climb the sea steps. Quiet as you go.",
                               "The old net sheds are north of the quay. Tell them I sent you."],
            "ask_rumors": ["Between friends? The customs boat is in for repairs all week.",
                           "They say the governor's wife buys my silk. They say right.",
                           "Word is there's a wreck off the point, and nobody's claimed it."],
            "trade": ["Keep your voice down and your purse open.",
                      "For you, a real bottle of brandy. Half price.",
                      "You want {item}? I'll find it, and I won't ask why."],
            "threaten": ["Easy, friend. We're on the same side.",
                         "Put that away before you hurt yourself.",
                         "Now why spoil a nice evening?"],
            "farewell": ["Safe roads, {player}. Or at least quiet ones.",
                         "Go well, friend. Keep your mouth shut and your eyes open.",
                         "Off you go. Come back when the moon is down."],
        },
        "wary": {
            "approach": ["Who sent you? Answer quick and answer true.",
                         "Not a sound, {player}. Get down.",
                         "Stay where you are. Hands out of your coat."],
            "greet": ["Hello? Keep it down, fool.",
                      "Who are you, and who's with you?",
                      "Quiet, {player}. Somebody's watching."],
            "ask_directions": ["Directions? Away from here, quickly.",
                               "Back the way you came, and don't run.",
                               "Any way but the beach tonight."],
            "ask_rumors": ["Somebody talked. When I find out who, the crabs get a feast.",
                           "You want news? The watch is out, that's the news.",
                           "If you've heard something, spit it out."],
            "trade": ["No trades. Not tonight.",
                      "The cargo stays hidden till morning.",
                      "Put your purse away. Someone's watching."],
            "threaten": ["Not another step. I've got a knife and no patience.",
                         "Try me, and nobody finds you till the tide gives you back.",
                         "You picked the wrong night to push me."],
            "farewell": ["Get gone, and if anyone asks, you were never on this beach.",
                         "Go. Slowly. Don't look back.",
                         "Leave now, and keep your lantern dark."],
        },
        "fight": {
            "approach": ["Stay down if you know what's good for you!",
                         "Keep your head down, {player}!",
                         "Don't just stand there!"],
            "greet": ["Hello? Duck, you fool!",
                      "No time for that, {player}!",
                      "Greet me later! Run now!"],
            "ask_directions": ["Follow me, and don't fall behind!",
                               "Up the cliff path! Go!",
                               "Any way but the beach!"],
            "ask_rumors": ["The rumor is we're all caught!",
                           "Ask questions later!",
                           "News? The customs men are here, that's the news!"],
            "trade": ["Trade? Now? Are you mad?",
                      "Keep your silver! Run!",
                      "The only deal tonight is staying alive!"],
            "threaten": ["You want a knife in you too?",
                         "Get out of my way or go in the water!",
                         "Touch me and I'll take you down with me!"],
            "farewell": ["No time! If they ask, you never knew me!",
                         "Run, {player}! Don't wait for me!",
                         "Go! I'll find you later, if I can!"],
        },
    },
    "harbormaster": {
        "calm": {
            "approach": ["Name of your ship and your business in port, {player}.",
                         "Mind the bollards, {player}.",
                         "Stay off the long pier, {player}. The planks are rotten."],
            "greet": ["Good day, {player}. Your papers, if you please.",
                      "Morning, {player}. What ship are you off?",
                      "Hello. Are you here to pay dues or to ask for a favor?"],
            "ask_directions": ["The customs house is at the end of the long pier. Bring your papers.",
                               "The fish market is just past the customs house.",
                               "The chandler's shop is up the quay, behind the net sheds."],
            "ask_rumors": ["A ship came in last night flying no colors. I've got my eye on her.",
                           "The lighthouse keeper's gone quiet. He hasn't signaled in two nights.",
                           "They say the smugglers use the old caves again. I say let them try."],
            "trade": ["Mooring's two silver a night. Four if you argue.",
                      "Harbor dues first, then we talk.",
                      "You want {item}? Ask at the customs house, and bring the dues."],
            "threaten": ["Stow that blade while you're on my pier.",
                         "Threaten me and you'll spend the night in the watch house.",
                         "I've thrown bigger men than you off this pier."],
            "farewell": ["Off you go. Mind the bollards.",
                         "Fair winds, {player}.",
                         "Good day, {player}. Don't block the gangway."],
        },
        "warm": {
            "approach": ["Sit, {player}. I'll put the kettle on.",
                         "Come and watch the boats with me, {player}.",
                         "Good to see you in port again, {player}."],
            "greet": ["{player}! Welcome back to port.",
                      "Hello, {player}. The harbor's been quiet without you.",
                      "Ah, {player}. Come in, come in."],
            "ask_directions": ["The fish market is just past the customs house. Ask for the widow with the blue shawl.",
                               "Follow the quay to the steps, friend. The town is at the top.",
                               "The customs house is at the end of the long pier. You can't miss it."],
            "ask_rumors": ["They say the smugglers use the old caves again. Not that you heard it from me.",
                           "Between us, the governor wants a new harbor wall and won't pay for it.",
                           "Word is a spice ship is due this week. The whole port is holding its breath."],
            "trade": ["For you, the good mooring by the steps. No charge.",
                      "Your dues can wait till the end of the month.",
                      "You want {item}? I know a chandler who owes me a favor."],
            "threaten": ["Easy, {player}. Nobody's your enemy here.",
                         "Put that away, friend. This is a peaceful harbor.",
                         "I'll pretend I didn't hear that."],
            "farewell": ["Safe passage, {player}. Come back in one piece.",
                         "Fair winds, friend.",
                         "Go well, {player}. I'll keep your berth for you."],
        },
        "wary": {
            "approach": ["Stand where you are. I'll not ask twice.",
                         "You there! What are you doing on my pier?",
                         "Hold it, {player}. Show me your hands."],
            "greet": ["Who gave you leave to be on this pier after dark?",
                      "Hello yourself. Now what ship are you off?",
                      "Evening, {player}. Strange hour to be about."],
            "ask_directions": ["Directions? Off this pier, for a start.",
                               "The watch house is that way, and you'll come with me.",
                               "Go back up the quay and stay there."],
            "ask_rumors": ["If you know anything about that ship, tell me now.",
                           "Rumors can wait. I want to know who's on my pier.",
                           "You heard something? Speak up."],
            "trade": ["No dues taken tonight. The harbor's closed.",
                      "Trade can wait till I know who's in my harbor.",
                      "Nothing moves on these piers until I say so."],
            "threaten": ["Try it, and you'll leave this harbor in irons.",
                         "One word from me and the watch is on you.",
                         "Back off my pier, {player}. Now."],
            "farewell": ["Go, and stay off the piers tonight.",
                         "Leave now, {player}, and don't come back after dark.",
                         "Off you go, and straight home."],
        },
        "fight": {
            "approach": ["Get back, {player}! Off the pier!",
                         "Keep your head down, {player}!",
                         "Move, {player}! Don't just stand there!"],
            "greet": ["Hello? Now? Grab a bucket!",
                      "No time, {player}!",
                      "Save it for later!"],
            "ask_directions": ["Up to the watch house! Go!",
                               "Off the pier and up the hill!",
                               "The town! Run for the town!"],
            "ask_rumors": ["The only news is the fire!",
                           "Ask me tomorrow, if there is one!",
                           "Rumors? Look at my harbor!"],
            "trade": ["No dues today! Run!",
                      "Trade? The pier's burning!",
                      "Keep your silver and save your ship!"],
            "threaten": ["Stand in my way and you go in the water!",
                         "Out of my way!",
                         "You'll answer for this in irons!"],
            "farewell": ["Not now, {player}! Run!",
                         "Go! Get to the town!",
                         "Run, {player}, and don't look back!"],
        },
    },
}

TIDE: dict[str, dict[bool, dict[str, list[str]]]] = {
    "quartermaster": {
        False: {"low": ["Low tide, and the hull plates are showing.",
                        "The tide's out and the stores are high and dry.",
                        "Low water, and the whole hold smells of mud."],
                "high": ["High water, and the ship rides easy on her lines.",
                         "The tide's in and the gangway's steep.",
                         "Tide's high, and the rum stays dry up here."]},
        True: {"low": ["Water's dropping, and anyone coming for the stores will come across the mud.",
                       "The tide's out, so mind the mud and the flats!",
                       "Low water! The boats are stuck on the mud!"],
               "high": ["Tide's up and there's a boat with no lantern.",
                        "High water! They'll come right up to the hull!",
                        "High water, and the hull's wide open to boarders!"]},
    },
    "smuggler": {
        False: {"low": ["The water's low and the flats are bare.",
                        "The flats are bare, and the mud keeps the customs men away.",
                        "Low tide, and my boat's sitting on the mud."],
                "high": ["Tide's high enough to float a skiff right under the sea wall.",
                         "High tide tonight, and no moon.",
                         "The water's high, and the cove is deep enough for the big boat."]},
        True: {"low": ["Someone's on the flats. I can hear the mud sucking at their boots.",
                       "Low water, and every footprint shows on the mud!",
                       "The tide's out, and they can walk right up the mud to us!"],
               "high": ["Lanterns on the water, and the tide's high!",
                        "High tide! Cut the skiff loose and let the sea take it!",
                        "The tide's in, and their boat can reach the cove!"]},
    },
    "harbormaster": {
        False: {"low": ["Low water, so no ship over six feet of draft comes in till evening.",
                        "The tide's out, and the harbor is all mud and old anchors.",
                        "Low tide. Even the ships are lying down on the mud."],
                "high": ["High water, and every captain wants the best berth.",
                         "The tide's in and the water's up to the steps.",
                         "High tide, so every ship ties fore and aft."]},
        True: {"low": ["The water's dropping fast. Anyone on the flats is a fool or a thief.",
                       "Low tide! They're wading in across the mud!",
                       "The tide's out and the channel's too shallow for the watch boat!"],
               "high": ["High tide and a stranger at the mouth of the harbor.",
                        "The tide's in! Pull up the gangways and let the sea keep them off!",
                        "High water! Every ship is loose on its lines!"]},
    },
}

MOODS: dict[str, tuple[list[str], tuple[str, ...]]] = {  # (openers, the intents they suit); calm and warm lines
    "gruff": (["Hmph.", "Bah.", "What now?"], ("approach", "greet", "ask_directions", "trade", "farewell")),
    "sly": (["Well, well.", "I know things, friend.", "Funny you should ask."], ("ask_rumors", "trade", "greet")),
    "weary": (["Oh, my aching back.", "I'm tired to the bone.", "Another long day."],
              ("approach", "greet", "ask_directions", "farewell")),
    "cheerful": (["Ha!", "What a grand day!", "Ho there!"], ("approach", "greet", "ask_directions", "farewell")),
    "nervous": (["Oh, it's you.", "Don't sneak up on me like that.", "Is someone watching us?"],
                ("approach", "greet", "ask_rumors")),
    "kind": (["Easy now, friend.", "There, there.", "Ah, good to see you."],
             ("approach", "greet", "ask_directions", "trade", "farewell")),
    "greedy": (["Silver first.", "Everything has a price.", "Coin talks."], ("trade",)),
    "proud": (["Best in the port, I am.", "Nobody does it better than me.", "I know my trade."],
              ("approach", "greet", "trade")),
    "brave": (["I'm not afraid of anyone.", "I've seen worse.", "Nothing frightens me."], ("approach", "greet")),
}


def compose(arch: str, state: str, intent: str, rng: random.Random, n: int) -> list[dict[str, str]]:
    """Up to ``n`` distinct rows for one (archetype, state, intent) cell."""
    tone = TONE[state]
    leads, replies = LEADS[arch][state], REPLIES[arch][tone][intent]
    urgent = tone in ("wary", "fight")
    plain = [f"{lead} {reply}" for lead in leads for reply in replies] + list(replies)
    if intent == "approach":
        plain += leads
    rng.shuffle(plain)
    picked = [(line, "") for line in plain[: n - n // 2]]
    for value in ("low", "high"):
        tides = TIDE[arch][urgent][value]
        lines = [f"{t} {reply}" for t in tides for reply in replies]
        if intent == "approach":
            lines += [f"{lead} {t}" for lead in leads for t in tides]
        rng.shuffle(lines)
        picked += [(line, value) for line in lines[: n // 4]]
    rows = [{"archetype": arch, "state": state, "line": line, "persona": "", "intent": intent,
             "context": f"tide={tide}" if tide else "", "like": LIKE[arch]} for line, tide in picked]
    if tone in ("calm", "warm"):
        traits = [t for t, (_, intents) in sorted(MOODS.items()) if intent in intents]
        for _ in range(n // 7 if traits else 0):
            trait = rng.choice(traits)
            rows.append({"archetype": arch, "state": state, "persona": trait, "intent": intent, "context": "",
                         "line": f"{rng.choice(MOODS[trait][0])} {rng.choice(replies)}", "like": LIKE[arch]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-cell", type=int, default=14, help="composed lines per (archetype, state, intent)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    with AUTHORED.open(newline="") as f:
        authored = [dict(r, like=LIKE.get(r["archetype"], "")) for r in csv.DictReader(f)]
    seen = {r["line"] for r in authored}
    rows = list(authored)
    for arch in LEADS:
        for state in STATES:
            for intent in INTENTS:
                rng = random.Random(f"{args.seed}:{arch}:{state}:{intent}")
                for row in compose(arch, state, intent, rng, args.per_cell):
                    if row["line"] not in seen:
                        seen.add(row["line"])
                        rows.append(row)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["archetype", "state", "line", "persona", "intent", "context", "like"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}: {len(rows)} lines ({len(authored)} authored, {len(rows) - len(authored)} composed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
