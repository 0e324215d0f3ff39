"""The app's pages, in their one order: the sidebar, the Home page's guide and README's table of pages list them so
(tests/pages/test_pages.py checks README's)."""

PAGES = (  # (page script, title, icon, what it is for, in a line)
    ("app_pages/home.py", "Home", ":material/home:", "What divviz is, and the way to each page."),
    ("app_pages/tour.py", "Tour", ":material/school:",
     "Start here: the walkthrough, each step's link, what to do and the numbers to expect."),
    ("app_pages/clipping_regions.py", "Clipping regions", ":material/straighten:",
     "Feasible intervals, the (π_old, π_new) plane, surrogate and gradient, logit room."),
    ("app_pages/kl3_equivalence.py", "KL3 ⇔ asymmetric clipping", ":material/function:",
     "The Lambert-W bounds, matching PPO/DAPO boxes, and a live numeric check."),
    ("app_pages/mass_reallocation.py", "Mass reallocation", ":material/bar_chart:",
     "An exact softmax bandit under GRPO: entropy, top-1 mass, where the mass goes, over seeds."),
    ("app_pages/claims.py", "Claims", ":material/fact_check:",
     "The papers' statements put to paired tests over seeds, with computed verdicts, on published runs."),
    ("app_pages/training_lab.py", "Training lab", ":material/model_training:",
     "GRPO runs on the built-in model, SmolLM2-135M or yours, one per objective, live; same-batch comparison."),
    ("app_pages/runs.py", "Runs", ":material/folder_open:",
     "Every saved run (yours, `divviz train`'s, the published ones): overlay, export, delete."),
    ("app_pages/step_inspector.py", "Step inspector", ":material/text_select_start:",
     "One step's completions token by token: what the constraint did to each, and why."),
    ("app_pages/catalogue.py", "Catalogue", ":material/menu_book:",
     "Every measure, its formula, parameters and valid ranges."),
)
